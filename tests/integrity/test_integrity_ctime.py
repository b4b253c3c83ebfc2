"""A change the mtime hides (docs/damage.md): a ``chmod`` mid-stream keeps a mount serving the right bytes; an
in-place rewrite with the mtime put back (``touch -r``) of bytes already served is never served, by a
buffered reader nor an O_DIRECT one, with ``--manifest`` (every chunk checked again) and without (the
checksums kept when they were served, in Python and in the C read path); and a folder's manifest covers
every file its mount serves or its views read, so a tampered ``config.json`` fails ``verify`` and ``diff``
and is not served under ``--manifest``.

Real mounts; the expected bytes are the file's own, read before anything changed; the manifest is the one
``ckptfs manifest`` writes.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import ckptfs_cli, cli_env
from fixtures import write_gguf
from integrity_fixtures import flip, reference_tensors
from mount_expect import read_direct

MIB = 1 << 20
NAME = b"Gemma 3 270m"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ckptfs_cli(), *args], env=cli_env(), capture_output=True, text=True, timeout=300)


@pytest.fixture
def model(tmp_path) -> Path:
    """A GGUF of a few MiB whose general.name is at a known place in its header, and its manifest."""
    rng = np.random.default_rng(7)
    path = tmp_path / "g.gguf"
    write_gguf(path, {"big": (rng.standard_normal(1 << 20).astype(np.float32), "F32"),
                      "small": (rng.standard_normal(1000).astype(np.float32), "F32")},
               {"general.name": NAME.decode()})
    manifest = tmp_path / "g.manifest.json"
    made = cli("manifest", str(path), "-o", str(manifest))
    assert made.returncode == 0, made.stderr
    return path


def _uncached(path: Path) -> bytes:
    """The file's bytes as the daemon serves them now: the page cache's copy of the mount's file dropped first."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return b"".join(iter(lambda: os.read(fd, MIB), b""))
    finally:
        os.close(fd)


def _rewrite_name(path: Path) -> None:
    """``printf J | dd of=g.gguf bs=1 seek=N conv=notrunc; touch -r saved g.gguf``."""
    offset = path.read_bytes().index(NAME)
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"J")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_ctime_ns != st.st_ctime_ns


def _mount(mounted, model: Path, manifest: bool) -> Path:
    return mounted(model, *(["--manifest", str(model.with_name("g.manifest.json"))] if manifest else []))


CASES = [(False, False), (True, False), (False, True), (True, True)]
IDS = ["buffered", "O_DIRECT", "buffered-manifest", "O_DIRECT-manifest"]


@pytest.mark.parametrize("direct,manifest", CASES, ids=IDS)
def test_chmod_mid_stream_keeps_serving(model, mounted, direct, manifest):
    expected = model.read_bytes()
    mnt = _mount(mounted, model, manifest)
    own = mnt / model.name
    half = len(expected) // 2
    first = read_direct(own, [(0, half)])[0] if direct else _uncached(own)[:half]
    model.chmod(0o600)  # ctime changes, bytes do not
    rest = read_direct(own, [(half, len(expected) - half)])[0] if direct else _uncached(own)[half:]
    assert first + rest == expected
    for name, _, data in reference_tensors(model):
        assert (mnt / f"{name}.raw").read_bytes() == data


@pytest.mark.parametrize("direct,manifest", CASES, ids=IDS)
def test_a_rewrite_that_puts_the_mtime_back_is_never_served(model, mounted, direct, manifest):
    expected = model.read_bytes()
    mnt = _mount(mounted, model, manifest)
    own = mnt / model.name
    assert (read_direct(own, [(0, len(expected))])[0] if direct else _uncached(own)) == expected  # all checked once
    _rewrite_name(model)
    with pytest.raises(OSError) as failed:
        got = read_direct(own, [(0, len(expected))])[0] if direct else _uncached(own)
        assert b"Jemma" not in got  # reached only if the read did not fail: then the old bytes, never the new
        raise OSError(errno.EIO, "old bytes served")
    assert failed.value.errno == errno.EIO


@pytest.mark.parametrize("manifest", [False, True], ids=["served", "manifest"])
def test_a_tensor_chunk_read_once_is_checked_again_after_a_rewrite(model, mounted, manifest):
    mnt = _mount(mounted, model, manifest)
    offset = {name: where for name, where, _ in reference_tensors(model)}["big"]
    original = read_direct(mnt / "big.raw", [(0, 4 * MIB)])[0]  # every chunk of it read (and checked)
    flip(model, offset + 3 * MIB + 5)  # mtime put back
    for path, start in ((mnt / "big.raw", 3 * MIB), (mnt / model.name, offset + 3 * MIB)):
        with pytest.raises(OSError) as failed:
            got = read_direct(path, [(start, MIB)])[0]
            assert got == original[3 * MIB:]  # reached only if the read did not fail: then the old bytes
            raise OSError(errno.EIO, "old bytes served")
        assert failed.value.errno == errno.EIO, path
    np.testing.assert_array_equal(np.load(mnt / "small.npy"), np.frombuffer(
        {n: d for n, _, d in reference_tensors(model)}["small"], np.float32))


@pytest.fixture
def folder(tmp_path) -> Path:
    """A model folder: weights, config, tokenizer and chat template, and its manifest beside it."""
    from safetensors.numpy import save_file

    folder = tmp_path / "model"
    folder.mkdir()
    save_file({"w": np.arange(4096, dtype=np.float32).reshape(64, 64)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"vocab": {"a": 0}}}))
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    made = cli("manifest", str(folder), "-o", str(tmp_path / "model.manifest.json"))
    assert made.returncode == 0, made.stderr
    return folder


def test_a_folders_manifest_covers_its_other_files(folder, tmp_path, mounted):
    manifest_path = tmp_path / "model.manifest.json"
    listed = {f["name"] for f in json.loads(manifest_path.read_text())["files"]}
    assert listed == {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"}
    assert cli("verify", str(folder), "--manifest", str(manifest_path)).returncode == 0
    flip(folder / "config.json", 3)
    verified = cli("verify", str(folder), "--manifest", str(manifest_path))
    assert verified.returncode == 3 and verified.stdout.startswith("config.json: sha256 "), verified
    differs = cli("diff", str(folder), str(manifest_path))
    assert differs.returncode != 0 and "'config.json' differs" in differs.stdout, differs
    mnt = mounted(folder, "--manifest", str(manifest_path))
    with pytest.raises(OSError) as failed:
        (mnt / "config.json").read_bytes()
    assert failed.value.errno == errno.EIO
    assert (mnt / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    np.testing.assert_array_equal(np.load(mnt / "w.npy"), np.arange(4096, dtype=np.float32).reshape(64, 64))


def test_a_tampered_config_never_flows_into_the_gguf_view(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from gguf_view_models import make_llama

    folder = make_llama(tmp_path / "tiny-llama")
    manifest = tmp_path / "m.json"
    assert cli("manifest", str(folder), "-o", str(manifest)).returncode == 0
    text = (folder / "config.json").read_text()
    assert '"rms_norm_eps": 1e-06' in text
    (folder / "config.json").write_text(text.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-01'))  # planted
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    refused = cli("mount", str(folder), str(mnt), "--gguf", "--manifest", str(manifest))
    try:
        assert refused.returncode == 1, refused
        err = refused.stderr.strip()
        assert "\n" not in err and "no gguf/ folder" in err and "config.json" in err, err
        assert "differ from the manifest" in err, err
    finally:
        if refused.returncode == 0:
            cli("umount", str(mnt))
    shutil.rmtree(mnt, ignore_errors=True)


def test_a_small_file_rewritten_after_it_was_served_is_never_served_again(folder, mounted):
    """Without a manifest: a folder's config.json (shorter than a checksum chunk) read once, then rewritten
    with its mtime put back, is EIO through an O_DIRECT reader, never the new bytes."""
    mnt = mounted(folder)
    config = folder / "config.json"
    before = config.read_bytes()
    assert read_direct(mnt / "config.json", [(0, 4096)])[0] == before
    flip(config, 5)
    with pytest.raises(OSError) as failed:
        got = read_direct(mnt / "config.json", [(0, 4096)])[0]
        assert got == before  # reached only if the read did not fail: then the old bytes
        raise OSError(errno.EIO, "old bytes served")
    assert failed.value.errno == errno.EIO


def test_the_c_read_path_sums_chunks_as_python_does(tmp_path):
    """The served checksums are recorded by either path and compared by the other: the C sums (the mount's C
    read path's, and ``_sums``' for Python's reads: of a buffer, and of a chunk read from a descriptor) give
    numpy's value for every length (a whole chunk, the shorter last one, lengths that are no multiple of 8);
    a chunk the file does not hold whole is None."""
    direct = pytest.importorskip("ckptfs.fuse._direct")
    sums = pytest.importorskip("ckptfs.sources._sums")
    from ckptfs.sources import served
    from ckptfs.sources.served import SUM_CHUNK, numpy_chunk_sum

    rng = np.random.default_rng(3)
    blob = rng.integers(0, 256, 2 * SUM_CHUNK, dtype=np.uint8).tobytes()
    (tmp_path / "f").write_bytes(blob)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        for n in (0, 1, 7, 8, 9, 4095, SUM_CHUNK - 3, SUM_CHUNK):
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            assert direct.chunk_sum(data) == sums.chunk_sum(data) == numpy_chunk_sum(data), n
            assert sums.chunk_sum_fd(fd, 5, n) == numpy_chunk_sum(blob[5:5 + n]), n
        assert sums.chunk_sum_fd(fd, 2 * SUM_CHUNK - 8, 9) is None
        served._sums = None  # the fallback reads and sums the same way
        try:
            assert served.chunk_sum_fd(fd, 3, SUM_CHUNK) == numpy_chunk_sum(blob[3:3 + SUM_CHUNK])
            assert served.chunk_sum_fd(fd, 2 * SUM_CHUNK - 8, 9) is None
        finally:
            served._sums = sums
    finally:
        os.close(fd)
    flipped = bytearray(data)
    flipped[12345] ^= 1
    assert numpy_chunk_sum(bytes(flipped)) != numpy_chunk_sum(data)
    assert sums.chunk_sum(bytes(flipped)) != sums.chunk_sum(data)


@pytest.mark.parametrize("summer", ["c", "numpy"])
def test_a_python_read_records_the_chunks_it_cuts_and_finds_them_rewritten(tmp_path, summer):
    """A read through a local source (the path of a decoded view's parts) whose range cuts a chunk at each end
    records those chunks whole (read for their sums: ``chunk_sum_fd``, in C or by numpy); a byte of such a
    chunk outside the first read, rewritten with the mtime put back, is refused when read later, never served
    (a chmod alone keeps serving)."""
    from ckptfs.core.errors import CheckpointError
    from ckptfs.sources import served
    from ckptfs.sources.local import FileSource
    from ckptfs.sources.served import SUM_CHUNK

    if summer == "c":
        pytest.importorskip("ckptfs.sources._sums")
    path = tmp_path / "f.bin"
    data = np.random.default_rng(8).integers(0, 256, 4 * SUM_CHUNK, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    saved = served._sums
    if summer == "numpy":
        served._sums = None
    try:
        source = FileSource(str(path))
        assert source.pread(SUM_CHUNK + 100, SUM_CHUNK) == data[SUM_CHUNK + 100:2 * SUM_CHUNK + 100]
        os.chmod(path, 0o600)  # the ctime moves: recorded chunks are compared from now on
        assert source.pread(SUM_CHUNK, 50) == data[SUM_CHUNK:SUM_CHUNK + 50]
        stat = os.stat(path)
        with open(path, "r+b") as f:  # in place, in chunk 2 after the first read's end
            f.seek(2 * SUM_CHUNK + 5000)
            f.write(bytes([data[2 * SUM_CHUNK + 5000] ^ 1]))
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        with pytest.raises(CheckpointError, match="served before differ"):
            source.pread(2 * SUM_CHUNK + 4000, 2000)
        assert source.pread(3 * SUM_CHUNK, 10) == data[3 * SUM_CHUNK:3 * SUM_CHUNK + 10]  # never read: no sum
    finally:
        served._sums = saved
