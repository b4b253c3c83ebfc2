"""``ckptfs info`` on large folders, and the files a folder's index file hides (docs/mount.md, "Large folders").

A folder of thousands of files is listed in the text form as its first 20 names and "... and N more files";
``--all`` lists every one and ``--json`` always holds them all. A folder of many checkpoints lists its first
20. When an index file names the checkpoint, a GGUF beside it is left out of the mount: ``ckptfs mount`` says
so in one line naming it.
"""

from __future__ import annotations

import json

import numpy as np
from cli_runs import run_cli
from fixtures import write_gguf
from multifile_sets import safetensors_tensors, write_safetensors_set

OTHER_FILES = 3000


def _many_files(folder):
    folder.mkdir()
    write_gguf(folder / "model.gguf", {"w": (np.ones(8, np.float32), "F32")})
    for i in range(OTHER_FILES):
        (folder / f"file-{i:05d}-with-a-rather-long-name.txt").write_text("x")
    return folder


def test_info_lists_the_first_names_of_a_large_folder(tmp_path):
    folder = _many_files(tmp_path / "big")
    text = run_cli("info", str(folder))
    assert text.returncode == 0, text.stderr
    line = next(line for line in text.stdout.splitlines() if line.startswith("other files"))
    assert line.startswith(f"other files ({OTHER_FILES}): file-00000-with-a-rather-long-name.txt, ")
    assert line.endswith(f"... and {OTHER_FILES - 20} more files (--all lists every one)")
    assert max(len(line) for line in text.stdout.splitlines()) < 2000
    every = run_cli("info", "--all", str(folder))
    assert every.returncode == 0, every.stderr
    assert all(f"file-{i:05d}-with-a-rather-long-name.txt" in every.stdout for i in range(OTHER_FILES))
    as_json = json.loads(run_cli("info", "--json", str(folder)).stdout)
    assert len(as_json["passthrough"]) == OTHER_FILES


def test_info_lists_the_first_checkpoints_of_a_large_repository(tmp_path):
    folder = tmp_path / "repo"
    folder.mkdir()
    for i in range(30):
        write_gguf(folder / f"quant-{i:02d}.gguf", {"w": (np.ones(4, np.float32), "F32")})
    text = run_cli("info", str(folder))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("repository: 30 checkpoints")
    assert sum(line.startswith("  quant-") for line in lines) == 20
    assert "  ... and 10 more checkpoints (--all lists every one)" in lines
    every = run_cli("info", "--all", str(folder)).stdout.splitlines()
    assert sum(line.startswith("  quant-") for line in every) == 30


def test_a_mount_names_the_checkpoint_an_index_hides(tmp_path, mountpoint):
    folder = tmp_path / "model"
    write_safetensors_set(folder, safetensors_tensors(2))
    write_gguf(folder / "model.gguf", {"w": (np.ones(8, np.float32), "F32")})
    mounted = run_cli("mount", str(folder), str(mountpoint))
    try:
        assert mounted.returncode == 0, mounted.stderr
        said = [line for line in mounted.stderr.splitlines() if "model.gguf" in line]
        assert len(said) == 1 and "model.safetensors.index.json" in said[0], mounted.stderr
        assert "model.gguf" not in [p.name for p in mountpoint.iterdir()]
    finally:
        run_cli("umount", str(mountpoint))
