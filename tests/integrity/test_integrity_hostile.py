"""The integrity commands against what a new user meets: a hostile manifest (a 5000-digit number, NaN, a
repeated key, wrong types), a truncated download, a duplicated manifest entry, an output path that cannot
be written. Each runs the real ``ckptfs`` command and checks the exit code and the one line (docs/integrity.md).

The truncated copies are cut at byte offsets chosen from the reference readers' tensor offsets (gguf-py,
safetensors), so which tensors are missing or cut short is known without ckptfs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_runs import run_cli
from conftest import force_unmount, is_mounted, require_fuse
from fixtures import write_mixed_gguf, write_safetensors
from integrity_fixtures import reference_tensors

import ckptfs
from ckptfs.core.errors import CheckpointError

FIRST_OFFSET = '"offset": '


def one_error_line(result: subprocess.CompletedProcess, code: int = 1) -> str:
    err = result.stderr
    assert result.returncode == code, (result.returncode, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> tuple[Path, Path]:
    """A GGUF of 22 tensors and its manifest, written by the real `ckptfs manifest`."""
    folder = tmp_path_factory.mktemp("hostile")
    path = Path(write_mixed_gguf(folder / "model.gguf").path)
    manifest = folder / "model.manifest.json"
    result = run_cli("manifest", str(path), "-o", str(manifest))
    assert result.returncode == 0, result.stderr
    return path, manifest


def with_first_offset(text: str, value: str) -> str:
    """The manifest with its first tensor's offset replaced by ``value`` (JSON text as it stands)."""
    start = text.index(FIRST_OFFSET) + len(FIRST_OFFSET)
    end = text.index(",", start)
    return text[:start] + value + text[end:]


HOSTILE = {
    "5000-digit integer": (lambda t: with_first_offset(t, "9" * 5000), "offset must be a non-negative integer",
                           "a 5000-digit number"),
    "negative 5000-digit integer": (lambda t: with_first_offset(t, "-" + "9" * 5000), "offset", "5000-digit"),
    "number past float range": (lambda t: with_first_offset(t, "1e999"), "offset", "Infinity"),
    "NaN": (lambda t: with_first_offset(t, "NaN"), "NaN is not a JSON number", ""),
    "Infinity": (lambda t: with_first_offset(t, "-Infinity"), "-Infinity is not a JSON number", ""),
    "offset as a string": (lambda t: with_first_offset(t, '"2240"'), "offset must be a non-negative integer",
                           '"2240"'),
    "repeated top-level key": (lambda t: t.replace('"chunk_size": 1048576,', '"chunk_size": 1048576, '
                                                   '"chunk_size": 2,', 1), 'key "chunk_size" appears twice', ""),
    "repeated key in a tensor": (lambda t: with_first_offset(t, '0, "offset": 1'), 'key "offset" appears twice', ""),
    "tensors as a string": (lambda t: t.replace('"tensors": [', '"tensors": "none", "x": [', 1),
                            'tensors must be a list, got "none"', ""),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_manifest_is_one_line_naming_the_file_and_field(tmp_path, gguf, case):
    path, manifest = gguf
    edit, *words = HOSTILE[case]
    bad = tmp_path / "bad.manifest.json"
    bad.write_text(edit(manifest.read_text()))
    expected_start = f"ckptfs: error: {bad}: not a valid ckptfs manifest: "
    for args in (("verify", str(path), "--manifest", str(bad)), ("diff", str(path), str(bad)),
                 ("diff", str(bad), str(path))):
        line = one_error_line(run_cli(*args))
        assert line.startswith(expected_start), (args, line)
        assert all(w in line for w in words) and "set_int_max_str_digits" not in line, (args, line)
        assert "GGUF or safetensors" not in line, line
    with pytest.raises(CheckpointError, match="not a valid ckptfs manifest"):
        ckptfs.open(path, manifest=bad)


def test_mount_with_a_hostile_manifest_is_one_line(tmp_path, gguf):
    require_fuse()
    path, manifest = gguf
    bad = tmp_path / "huge.manifest.json"
    bad.write_text(with_first_offset(manifest.read_text(), "9" * 5000))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        line = one_error_line(run_cli("mount", str(path), str(mnt), "--manifest", str(bad)))
    finally:
        if is_mounted(mnt):
            force_unmount(mnt)
    assert line == (f"ckptfs: error: {bad}: not a valid ckptfs manifest: tensors[0] ('f32.vec').offset must be "
                    f"a non-negative integer, got a 5000-digit number")
    assert not is_mounted(mnt)


def truncated_copy(path: Path, folder: Path, cut: int) -> Path:
    copy = folder / f"cut-{cut}{path.suffix}"
    copy.write_bytes(path.read_bytes()[:cut])
    return copy


def expected_lines(path: Path, name: str, cut: int) -> list[str]:
    """verify's lines for ``path`` cut at ``cut``, from the reference reader's tensor offsets."""
    size = path.stat().st_size
    lines = [f"{name}: size {cut} bytes, the manifest says {size}: {size - cut} bytes short (a truncated copy?)"]
    for tensor, offset, data in sorted(reference_tensors(path), key=lambda t: t[1]):
        end = offset + len(data)
        if end <= cut:
            continue
        if offset >= cut:
            lines.append(f"{name}: tensor {tensor!r}: missing: its stored bytes {offset}..{end} lie past the end "
                         f"of the file ({cut} bytes)")
        else:
            lines.append(f"{name}: tensor {tensor!r}: truncated: the file ends at byte {cut}, {end - cut} of its "
                         f"{len(data)} stored bytes ({offset}..{end}) are missing")
    return lines


@pytest.fixture(scope="module")
def safetensors_file(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("hostile-st")
    rng = np.random.default_rng(3)
    path = Path(write_safetensors(folder / "model.safetensors", {
        "a.weight": rng.standard_normal((16, 32)).astype(np.float32),
        "b.weight": rng.standard_normal((8, 32)).astype(np.float16),
        "c.bias": rng.standard_normal(32).astype(np.float32)}).path)
    manifest = folder / "model.manifest.json"
    assert run_cli("manifest", str(path), "-o", str(manifest)).returncode == 0
    return path, manifest


@pytest.mark.parametrize("kind", ["gguf", "safetensors"])
def test_verify_a_truncated_copy_is_a_mismatch_per_tensor(tmp_path, gguf, safetensors_file, kind):
    path, manifest = gguf if kind == "gguf" else safetensors_file
    offsets = sorted((offset, len(data)) for _, offset, data in reference_tensors(path))
    # inside the third-last tensor: it is cut short, the last two are missing
    offset, nbytes = offsets[-3]
    cut = offset + max(1, nbytes // 2)
    copy = truncated_copy(path, tmp_path, cut)
    result = run_cli("verify", str(copy), "--manifest", str(manifest))
    assert result.returncode == 3, result.stderr
    expected = expected_lines(path, path.name, cut)
    assert result.stdout.splitlines() == expected
    assert sum("truncated:" in line for line in expected) == 1 and sum("missing:" in line for line in expected) >= 2
    assert result.stderr == f"{len(expected)} mismatches against the manifest\n"


def test_diff_with_a_truncated_copy_reports_each_cut_tensor(tmp_path, gguf):
    path, manifest = gguf
    tensors = sorted(reference_tensors(path), key=lambda t: t[1])
    name, offset, data = tensors[-2]
    cut = offset + len(data) // 2
    copy = truncated_copy(path, tmp_path, cut)
    cut_names = [n for n, o, d in tensors if o + len(d) > cut]
    for args in (("diff", str(path), str(copy), "--values"), ("diff", str(manifest), str(copy))):
        result = run_cli(*args)
        assert result.returncode == 3, (args, result.stderr)
        lines = result.stdout.splitlines()
        changed = [line for line in lines[:-1]]
        assert [line.split(":")[0] for line in changed] == [repr(n) for n in cut_names], lines
        assert f"B: truncated: the file ends at byte {cut}" in changed[0]
        assert all("B: missing: its stored bytes" in line for line in changed[1:])
        if "--values" in args:
            assert all(line.endswith("values not compared: B is truncated") for line in changed)
        same = len(tensors) - len(cut_names)
        assert lines[-1] == f"{same} tensors identical, {len(cut_names)} changed, 0 only in A, 0 only in B"


def test_a_duplicated_manifest_entry_is_a_duplicate_not_missing(tmp_path, gguf):
    path, manifest = gguf
    text = manifest.read_text()
    first = text.index('    {"name": "q8_0.mat"')
    entry = text[first:text.index("\n", first) + 1]
    doubled = tmp_path / "doubled.manifest.json"
    doubled.write_text(text.replace(entry, entry + entry, 1))
    result = run_cli("verify", str(path), "--manifest", str(doubled))
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines() == [
        "model.gguf: tensor 'q8_0.mat': duplicate: the manifest lists it twice, the checkpoint holds it once"]
    assert result.stderr == "1 mismatch against the manifest\n"


def test_manifest_to_a_path_that_cannot_be_written_names_that_path(tmp_path, gguf):
    path, _ = gguf
    target = tmp_path / "no-such-folder" / "x.json"
    line = one_error_line(run_cli("manifest", str(path), "-o", str(target)))
    assert line == f"ckptfs: error: cannot write {target}: No such file or directory"
    assert not target.parent.exists()
    folder = tmp_path / "out"
    folder.mkdir()
    os.truncate(truncated_copy(path, folder, 3000), 3000)
    refused = one_error_line(run_cli("manifest", str(folder / "cut-3000.gguf"), "-o", str(folder / "m.json")))
    assert "lie past the end of the file" in refused
    assert sorted(os.listdir(folder)) == ["cut-3000.gguf"]  # no temporary file left behind
