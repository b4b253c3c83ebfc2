"""Checked reads (``manifest=`` / ``mount --manifest``): a read is widened to the unchecked manifest chunks it
covers and no further, a chunk found good is not read again for checking while the file keeps its identity,
a mismatch is an IntegrityError naming the tensor, and through a real FUSE mount it is EIO with one log line.

With mirrors (``mirrors=`` / ``--mirror``) each copy is checked on its own: a mismatch in the primary is
served from a mirror whose bytes match, and when every copy is corrupt the read fails naming each of them.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from conftest import ckptfs_cli, cli_env, require_fuse
from fixtures import write_mixed_gguf
from integrity_fixtures import big_safetensors, flip, reference_tensors

import ckptfs
from ckptfs.core.errors import CheckpointError, IntegrityError
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.formats.multi import read_checkpoint
from ckptfs.integrity.checked import ManifestCheck
from ckptfs.integrity.manifest import build_manifest, load_manifest
from ckptfs.sources.base import ByteSource
from ckptfs.sources.local import FileSource

MIB = 1 << 20


class Counting(ByteSource):
    """Records every range asked of the file."""

    def __init__(self, inner: FileSource):
        self.inner, self.name, self.size, self.identity = inner, inner.name, inner.size, inner.identity
        self.calls: list[tuple[int, int]] = []

    def pread(self, offset: int, size: int, *, scope: ReadScope = NOTHING_SAID) -> bytes:
        self.calls.append((offset, offset + size))
        return self.inner.pread(offset, size, scope=scope)


@pytest.fixture
def big(tmp_path):
    path = tmp_path / "big.safetensors"
    tensors = big_safetensors(path)
    with ckptfs.open(path) as ck:
        manifest = build_manifest(ck)
    offsets = {name: (offset, len(data)) for name, offset, data in reference_tensors(path)}
    return path, tensors, manifest, offsets


def test_reads_widen_to_unchecked_chunks_only_once(big):
    path, _, manifest, offsets = big
    blob = path.read_bytes()
    check = ManifestCheck(manifest, read_checkpoint(str(path)))
    source = Counting(FileSource(str(path)))
    checked = check.wrap(source)
    header = (0, min(offset for offset, _ in offsets.values()))
    assert source.calls == [header]  # the header is checked when the file is opened, once
    source.calls.clear()
    start, nbytes = offsets["big.weight"]
    chunk1 = (start + MIB, start + 2 * MIB)
    # 100 bytes inside chunk 1: the whole chunk is read (and checked) once, the 100 bytes cut from it
    assert checked.pread(start + MIB + 10, 100) == blob[start + MIB + 10:start + MIB + 110]
    assert source.calls == [chunk1]
    # again, and elsewhere in the same chunk: exactly what is asked, nothing widened
    assert checked.pread(start + MIB + 500, 4096) == blob[start + MIB + 500:start + MIB + 4596]
    assert source.calls[-1] == (start + MIB + 500, start + MIB + 4596)
    # across chunks 1 and 2: only chunk 2 (the tensor's last, short one) is added
    assert checked.pread(start + 2 * MIB - 8, 16) == blob[start + 2 * MIB - 8:start + 2 * MIB + 8]
    assert source.calls[-1] == (start + 2 * MIB - 8, start + nbytes)
    # header bytes belong to no tensor: passed through as asked
    assert checked.pread(0, 8) == blob[:8]
    assert source.calls[-1] == (0, 8)
    assert checked.checked_chunks() == 2
    # a second wrapper of the same unchanged file shares what is known good
    again = Counting(FileSource(str(path)))
    check.wrap(again).pread(start + MIB, 64)
    assert again.calls == [(start + MIB, start + MIB + 64)]


def test_a_changed_file_is_checked_again(big):
    path, _, manifest, offsets = big
    check = ManifestCheck(manifest, read_checkpoint(str(path)))
    start, _ = offsets["mid.weight"]
    check.wrap(FileSource(str(path))).pread(start, 10)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a new identity, same bytes
    source = Counting(FileSource(str(path)))
    check.wrap(source).pread(start, 10)
    assert source.calls == [(0, min(offset for offset, _ in offsets.values())), (start, start + 600_000)]


def test_mismatch_names_tensor_and_chunk_and_other_chunks_serve(big):
    path, tensors, manifest, offsets = big
    start, _ = offsets["big.weight"]
    flip(path, start + MIB + 3)
    with ckptfs.open(path, manifest=manifest) as ck:
        t = ck["big.weight"]
        np.testing.assert_array_equal(t[:256], tensors["big.weight"][:256])   # chunk 0: rows 0..255
        np.testing.assert_array_equal(t[520:], tensors["big.weight"][520:])   # chunk 2
        with pytest.raises(IntegrityError) as info:
            t[300]
        assert isinstance(info.value, CheckpointError)
        assert str(info.value).startswith(f"{path} @ byte {start + MIB}: tensor 'big.weight': stored bytes "
                                          f"{start + MIB}..{start + 2 * MIB} (chunk 1 of 3) differ from the manifest")
        np.testing.assert_array_equal(ck["norm.weight"].numpy(), tensors["norm.weight"])


def test_open_refuses_a_manifest_of_another_checkpoint(tmp_path, big):
    _, _, manifest, _ = big
    other = write_mixed_gguf(tmp_path / "big.safetensors")  # same name, other content
    with pytest.raises(CheckpointError, match="the manifest does not describe this checkpoint: tensor"):
        ckptfs.open(other.path, manifest=manifest)


def test_a_renamed_single_file_still_matches(tmp_path, big):
    path, tensors, manifest, _ = big
    renamed = tmp_path / "renamed.safetensors"
    shutil.copyfile(path, renamed)
    with ckptfs.open(renamed, manifest=manifest) as ck:
        np.testing.assert_array_equal(ck["big.weight"].numpy(), tensors["big.weight"])


# ------------------------------------------------------------------------------------------------ mirrors

@pytest.fixture
def mirrored(big, tmp_path):
    """A corrupt primary (a byte of big.weight's third chunk flipped, past the 2 MiB the mirror layer compares
    at open) and an intact mirror, both written by the reference writer."""
    path, tensors, manifest, offsets = big
    mirror = tmp_path / "mirror" / "big.safetensors"
    mirror.parent.mkdir()
    big_safetensors(mirror)
    start, _ = offsets["big.weight"]
    flip(path, start + 2 * MIB + 5)
    return path, mirror, tensors, manifest, start


def test_mismatch_served_from_a_mirror_that_matches(mirrored):
    path, mirror, tensors, manifest, _ = mirrored
    with ckptfs.open(path, manifest=manifest, mirrors=[str(mirror)]) as ck:
        np.testing.assert_array_equal(ck["big.weight"].numpy(), tensors["big.weight"])
    with ckptfs.open(path, manifest=manifest) as ck, pytest.raises(IntegrityError):
        ck["big.weight"].numpy()  # the same read without the mirror


def test_mirror_also_corrupt(mirrored):
    path, mirror, tensors, manifest, start = mirrored
    flip(mirror, start + 2 * MIB + 9)
    with ckptfs.open(path, manifest=manifest, mirrors=[str(mirror)]) as ck:
        with pytest.raises(CheckpointError) as info:
            ck["big.weight"].numpy()
        message = str(info.value)
        assert "tensor 'big.weight'" in message and "\n" not in message
        for copy in (path, mirror):  # each copy's own mismatch is named
            assert f"{copy} @ byte {start + 2 * MIB}: tensor 'big.weight': stored bytes {start + 2 * MIB}.." in message
        np.testing.assert_array_equal(ck["big.weight"][:512], tensors["big.weight"][:512])  # intact chunks serve


# ------------------------------------------------------------------------------------------ a real mount

def test_mount_serves_exact_bytes_and_eio_with_one_log_line(tmp_path, mounted):
    written = write_mixed_gguf(tmp_path / "m.gguf")
    manifest = tmp_path / "m.manifest.json"
    result = subprocess.run([*ckptfs_cli(), "manifest", str(written.path), "-o", str(manifest)], env=cli_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    offset = {n: o for n, o, _ in reference_tensors(written.path)}["q4_k.mat"]
    flip(written.path, offset + 100)
    log = tmp_path / "mount.log"
    mnt = mounted(written.path, "--manifest", str(manifest), "--log-file", str(log))
    for name, ref in written.tensors.items():
        if name == "q4_k.mat":
            continue
        assert (mnt / f"{name}.raw").read_bytes() == ref.raw
        if ref.array is not None:
            expected = io.BytesIO()
            np.save(expected, ref.array)
            assert (mnt / f"{name}.npy").read_bytes() == expected.getvalue()
    before = log.read_text()
    fd = os.open(mnt / "q4_k.mat.raw", os.O_RDONLY | os.O_DIRECT)
    try:
        with pytest.raises(OSError) as info:
            os.pread(fd, 4096, 0)
    finally:
        os.close(fd)
    assert info.value.errno == errno.EIO
    new = [line for line in log.read_text()[len(before):].splitlines() if "EIO" in line]
    assert len(new) == 1, new
    assert "tensor 'q4_k.mat'" in new[0] and "differ from the manifest" in new[0]
    with pytest.raises(OSError) as info:
        (mnt / "q4_k.mat.npy").read_bytes()
    assert info.value.errno == errno.EIO
    # every read was checked: none was answered by the C read path, which serves plain local ranges only
    assert json.loads(os.getxattr(mnt, "user.ckptfs.stats"))["c_reads"]["reads"] == 0


def test_mount_with_a_mirror_serves_the_matching_copy(mirrored, mounted):
    path, mirror, tensors, manifest, _ = mirrored
    manifest_file = path.parent / "big.manifest.json"
    manifest_file.write_text(manifest.dumps())
    mnt = mounted(path, "--manifest", str(manifest_file), "--mirror", str(mirror))
    expected = io.BytesIO()
    np.save(expected, tensors["big.weight"])
    assert (mnt / "big.weight.npy").read_bytes() == expected.getvalue()


def test_mount_refuses_a_malformed_or_foreign_manifest_in_one_line(tmp_path):
    require_fuse()  # the checkpoint is opened after the FUSE checks
    written = write_mixed_gguf(tmp_path / "m.gguf")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    other = tmp_path / "other.json"
    path = tmp_path / "x.safetensors"
    big_safetensors(path)
    with ckptfs.open(path) as ck:
        other.write_text(build_manifest(ck).dumps())
    for manifest, phrase in ((broken, "not a ckptfs manifest: not JSON"),
                             (other, "the manifest does not describe this checkpoint")):
        result = subprocess.run([*ckptfs_cli(), "mount", str(written.path), str(mnt), "--manifest", str(manifest)],
                                env=cli_env(), capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and result.stderr.count("\n") == 1 and phrase in result.stderr, result.stderr
        assert not os.path.ismount(mnt)
    assert load_manifest(str(other)).files[0].name == "x.safetensors"
