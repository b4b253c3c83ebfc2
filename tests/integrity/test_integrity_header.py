"""A manifest covers each file's header: ``files[].header_sha256``, the sha256 of the bytes before the tensor
data (GGUF header, metadata and tensor infos up to the data start; safetensors' 8-byte length and JSON header).

The tampering is real: one token of a metadata string changed in place (``Hello`` -> ``Jello``, same length, so
every tensor keeps its bytes and offsets). With the manifest, ``ckptfs.open``, ``mount`` and ``diff`` must
refuse or report it; a manifest written before the field existed still loads, checks no header and says so
once. Oracles for where the header ends: gguf-py's ``GGUFReader.data_offset`` and the safetensors length
prefix read with ``struct``; hashes by ``hashlib``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from cli_runs import one_error_line, run_cli
from conftest import force_unmount, require_fuse
from fixtures import write_gguf, write_safetensors

import ckptfs
from ckptfs.core.errors import CheckpointError, IntegrityError
from ckptfs.integrity.manifest import load_manifest

GREETING = "Hello from the header"


def _gguf(path: Path) -> Path:
    rng = np.random.default_rng(3)
    write_gguf(path, {"a.weight": (rng.standard_normal((8, 64)).astype(np.float32), "F32"),
                      "b.weight": (rng.standard_normal((4, 256)).astype(np.float32), "Q8_0")},
               metadata={"general.name": GREETING})
    return path


def _safetensors(path: Path) -> Path:
    rng = np.random.default_rng(4)
    write_safetensors(path, {"a.weight": rng.standard_normal((8, 64)).astype(np.float32)},
                      metadata={"greeting": GREETING})
    return path


def _data_start(path: Path) -> int:
    blob = path.read_bytes()
    if blob[:4] == b"GGUF":
        from gguf import GGUFReader

        return int(GGUFReader(str(path)).data_offset)
    return 8 + struct.unpack("<Q", blob[:8])[0]


def _tampered(path: Path, folder: Path) -> Path:
    """A copy of ``path`` with one token of its header changed in place (size, mtime and tensors kept)."""
    blob = path.read_bytes()
    at = blob.index(b"Hello")
    assert at < _data_start(path)
    copy = folder / f"tampered{path.suffix}"
    copy.write_bytes(blob[:at] + b"J" + blob[at + 1:])
    st = os.stat(path)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    return copy


def _manifest(path: Path, out: Path) -> Path:
    result = run_cli("manifest", str(path), "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(params=["gguf", "safetensors"])
def case(request, tmp_path):
    """(original, tampered copy in a folder of its own, manifest of the original)."""
    path = _gguf(tmp_path / "m.gguf") if request.param == "gguf" else _safetensors(tmp_path / "m.safetensors")
    (tmp_path / "copy").mkdir()
    return path, _tampered(path, tmp_path / "copy"), _manifest(path, tmp_path / "m.manifest.json")


def _old_manifest(manifest: Path, out: Path) -> Path:
    """The manifest as a version without header_sha256 wrote it."""
    data = json.loads(manifest.read_text())
    for f in data["files"]:
        del f["header_sha256"]
    out.write_text(json.dumps(data))
    return out


def test_the_manifest_holds_each_header_sha256(case):
    path, _, manifest = case
    data = json.loads(manifest.read_text())
    (entry,) = data["files"]
    assert entry["header_sha256"] == hashlib.sha256(path.read_bytes()[:_data_start(path)]).hexdigest()
    assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert load_manifest(str(manifest)).files[0].header_sha256 == entry["header_sha256"]


def test_open_refuses_a_changed_header(case):
    path, tampered, manifest = case
    with ckptfs.open(path, manifest=str(manifest)) as ck:
        assert GREETING in json.dumps(dict(ck.metadata), default=str)
    with ckptfs.open(tampered) as ck:  # without the manifest it opens, serving the changed token
        assert "Jello" in json.dumps(dict(ck.metadata), default=str)
    with pytest.raises(IntegrityError) as info:
        ckptfs.open(tampered, manifest=str(manifest))
    message = str(info.value)
    assert "\n" not in message and str(tampered) in message and "header" in message, message
    assert isinstance(info.value, CheckpointError)


def test_mount_refuses_a_changed_header_in_one_line(case, tmp_path):
    require_fuse()
    _, tampered, manifest = case
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        result = run_cli("mount", str(tampered), str(mnt), "--manifest", str(manifest))
        one_error_line(result, 1, str(tampered), "header", "differs from the manifest")
        assert not os.path.ismount(mnt)
    finally:
        force_unmount(mnt)


def test_diff_reports_a_changed_header(case):
    path, tampered, manifest = case
    n = len(load_manifest(str(manifest)).tensors)
    same = run_cli("diff", str(manifest), str(path))
    assert same.returncode == 0, same.stdout + same.stderr
    for a in (str(manifest), str(path)):
        result = run_cli("diff", a, str(tampered))
        assert result.returncode == 3, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert lines[-1] == f"{n} tensor{'s' if n > 1 else ''} identical, 0 changed, 0 only in A, 0 only in B"
        assert len(lines) == 2 and lines[0].startswith(f"header of '{path.name}' differs"), lines
        data = json.loads(run_cli("diff", a, str(tampered), "--json").stdout)
        expected = hashlib.sha256(tampered.read_bytes()[:_data_start(tampered)]).hexdigest()
        assert [(h["file"], h["b"]) for h in data["headers"]] == [(path.name, expected)]


def test_verify_says_the_header_differs(case):
    _, tampered, manifest = case
    result = run_cli("verify", str(tampered), "--manifest", str(manifest))
    assert result.returncode == 3, result.stderr
    (line,) = result.stdout.splitlines()
    assert "sha256" in line and "its header (metadata, tensor infos) differs" in line, line


def test_an_old_manifest_checks_no_header_and_warns_once(case, tmp_path, caplog):
    path, tampered, manifest = case
    old = _old_manifest(manifest, tmp_path / "old.manifest.json")
    with caplog.at_level(logging.WARNING, logger="ckptfs"):
        for _ in range(2):
            with ckptfs.open(tampered, manifest=str(old)) as ck:
                assert "Jello" in json.dumps(dict(ck.metadata), default=str)
    warnings = [r.getMessage() for r in caplog.records if "header_sha256" in r.getMessage()]
    assert len(warnings) == 1 and str(old) in warnings[0] and "ckptfs manifest" in warnings[0], warnings
    result = run_cli("diff", str(old), str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert "header_sha256" in line and str(old) in line, result.stderr


def test_a_malformed_header_sha256_is_one_line(case, tmp_path):
    path, _, manifest = case
    data = json.loads(manifest.read_text())
    data["files"][0]["header_sha256"] = "xyz"
    bad = tmp_path / "bad.manifest.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"files\[0\]\.header_sha256 must be 64 lower-case hex digits"):
        load_manifest(str(bad))
    one_error_line(run_cli("diff", str(bad), str(path)), 1, "header_sha256")


def test_a_remote_header_is_checked_from_the_bytes_the_open_fetched(tmp_path, mounted):
    """Over HTTP (nginx), a header of several MiB (a 262,144-token vocabulary): the mount with the manifest
    serves the original, and refuses a copy with one token changed, in one line naming its URL."""
    pytest.importorskip("urllib3")
    from fixtures import big_vocab_gguf
    from loopback.servers import Nginx
    from conftest import require_nginx

    require_nginx()
    root = tmp_path / "www"
    root.mkdir()
    path = big_vocab_gguf(root / "vocab.gguf").path
    blob = path.read_bytes()
    at = blob.index(b"tok100000")
    assert _data_start(path) > 4 << 20 and at < _data_start(path)
    (root / "tampered.gguf").write_bytes(blob[:at] + b"T" + blob[at + 1:])
    manifest = _manifest(path, tmp_path / "vocab.manifest.json")
    with Nginx(root) as server:
        mnt = mounted(server.url + "/vocab.gguf", "--manifest", str(manifest), "--timeout", "30")
        tokens = json.loads((mnt / "metadata.json").read_text())["tokenizer.ggml.tokens"]
        assert tokens[100000] == "tok100000"
        bad = tmp_path / "mnt-bad"
        bad.mkdir()
        try:
            result = run_cli("mount", server.url + "/tampered.gguf", str(bad), "--manifest", str(manifest))
            one_error_line(result, 1, "tampered.gguf", "header", "differs from the manifest")
            assert not os.path.ismount(bad)
        finally:
            force_unmount(bad)
