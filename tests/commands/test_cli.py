"""The command line's own answers: a usage error is one line with exit code 2 that points to ``--help``,
``--help`` is whole, sizes are binary units (``64MB`` is refused as ambiguous), and ``info`` escapes control
characters in names and values so that none splits a line.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from cli_runs import one_error_line, run_cli
from fixtures import write_gguf


@pytest.mark.parametrize("args, words", [
    (["info"], ["Missing argument"]), (["mount", "SRC"], ["Missing argument"]),
    (["info", "SRC", "--dtype", "bf16"], ["--dtype"]), (["mount", "SRC", "MNT", "--dtype", "bf16"], ["bf16"]),
    (["mount", "SRC", "MNT", "--cache-size", "10X"], ["10X"]), (["mount", "SRC", "MNT", "--bad"], ["--bad"]),
    (["bogus"], ["bogus"]), (["bench", "SRC", "--cache-size", "64MB"], ["64MB", "ambiguous"]),
])
def test_usage_errors_are_one_line_with_exit_code_2(args, words):
    err = one_error_line(run_cli(*args), 2, *words)
    assert "--help" in err


def test_help_is_still_whole():
    result = run_cli("mount", "--help")
    assert result.returncode == 0 and "Usage:" in result.stdout and "--cache-size" in result.stdout
    assert "keep their stored dtype" in " ".join(result.stdout.split())  # item 12: --dtype float16, said plainly


@pytest.mark.parametrize("command", ["umount", "info"])
def test_verbose_is_explained_in_help(command):
    from ckptfs.commands.cli import main

    verbose, = [p for p in main.commands[command].params if p.name == "verbose"]
    assert "traceback" in (verbose.help or ""), verbose.help


def test_info_escapes_control_characters_in_names_and_values(tmp_path):
    template = "{% for m in messages %}\n{{ m.content }}\r\n{% endfor %}"
    path = tmp_path / "odd.gguf"
    write_gguf(path, {"bad\nname": (np.ones((4, 32), np.float32), "Q8_0")},
               {"tokenizer.chat_template": template, "odd\nkey\x1b[31m": "v\tw"})
    os.truncate(path, path.stat().st_size - 60)  # the tensor is damaged: info lists its name
    result = run_cli("info", str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "  tokenizer.chat_template = {% for m in messages %}\\n{{ m.content }}\\r\\n{% endfor %}" in lines
    assert "  odd\\nkey\\x1b[31m = v\\tw" in lines
    assert any(line.startswith("  'bad\\nname' (Q8_0): truncated") for line in lines), lines
    assert "\x1b" not in result.stdout and "\r" not in result.stdout


@pytest.mark.parametrize("text, size", [("512M", 512 << 20), ("64MiB", 64 << 20), ("1.5G", 3 << 29), ("0", 0),
                                        ("4096", 4096), ("1P", 1 << 50), ("7E", 7 << 60), ("2k", 2048)])
def test_sizes_in_binary_units(text, size):
    from ckptfs.util.sizes import parse_size

    assert parse_size(text) == size


@pytest.mark.parametrize("text, words", [("64MB", "ambiguous"), ("1GB", "ambiguous"), ("99999999999T", "too large"),
                                         ("8E", "too large"), ("-1", "not a size"), ("10X", "not a size")])
def test_sizes_refused(text, words):
    from ckptfs.util.sizes import parse_size

    with pytest.raises(ValueError, match=words):
        parse_size(text)
