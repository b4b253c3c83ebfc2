"""The README's commands run as written on a fresh root-only machine after ``scripts/setup.sh``.

- No command starts with ``sudo`` (a root-only Debian image has none), every mountpoint a ``ckptfs mount``
  uses is made by a ``mkdir -p`` before it, and every program run is one the set-up provides (``ckptfs``
  from the virtual environment, the llama.cpp binary ``scripts/build_llama_cpp.sh`` builds, the base system's
  tools): no ``llama-cli``.
- The local tour runs for real, line for line, in bash: from a folder holding the set-up's ``demo/demo.gguf``
  and ``.venv`` (this test's interpreter's environment), with only its mountpoint moved under the test's
  temporary folder.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO, cli_env, force_unmount, is_mounted, require_fuse

#: the programs a README command may run: the set-up's and the base system's
PROVIDED = {"bash", "ckptfs", "python", "ls", "cat", "mkdir", ".", '"$(bash'}


def _blocks() -> list[list[str]]:
    """The README's shell blocks (``` fences that are not Python), as lists of command lines."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S)
    return [[line.split("  #")[0].strip() for line in body.splitlines() if line.strip()]
            for lang, body in blocks if lang in ("", "sh", "bash", "shell")]


def test_every_command_runs_on_a_root_only_machine():
    blocks = _blocks()
    assert len(blocks) >= 3
    for lines in blocks:
        made: set[str] = set()
        for line in lines:
            program = line.split()[0]
            assert program != "sudo", line
            assert program in PROVIDED, line
            if program == "mkdir":
                made.update(word for word in line.split()[1:] if not word.startswith("-"))
            if line.startswith("ckptfs mount "):
                assert line.split()[3] in made, f"{line}: no mkdir -p of its mountpoint before it"
            if program == '"$(bash':
                assert line.startswith('"$(bash scripts/build_llama_cpp.sh --path)" '), line


def test_the_local_tour_runs_as_written(tmp_path):
    require_fuse()
    sys.path.insert(0, str(REPO / "scripts"))
    from make_demo_gguf import write_demo

    tour = next(lines for lines in _blocks() if any("demo/demo.gguf" in line for line in lines))
    (tmp_path / "demo").mkdir()
    write_demo(str(tmp_path / "demo" / "demo.gguf"))
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    mnt = tmp_path / "mnt" / "m"
    script = "set -e\n" + "\n".join(line.replace("/mnt/m", str(mnt)) for line in tour) + "\n"
    try:
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                              timeout=180)
    finally:
        if is_mounted(mnt):
            force_unmount(mnt)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "blk.0.attn_q.weight.npy" in done.stdout
    assert '"storage_type": "Q4_K"' in done.stdout
    assert not is_mounted(mnt)
