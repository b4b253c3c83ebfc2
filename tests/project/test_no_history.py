"""The README, docs, code, tests and scripts describe the product as it is, not how it was built: no numbered
work items ("issue 24", "issue #24"), no "wave N", no ordinal or other accounts of working sessions
("fourth session", "this session"), no "the lead", no helpers' runs. History is in git.

Product words stay allowed: a FUSE session (libfuse's session loop), an HTTP or boto3 session, the mount(8)
helper and the C read helper. Each line that matches is reported with its file and line number.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO

SCOPE = ["README.md", "docs", "ckptfs", "tests", "scripts"]
TEXT_SUFFIXES = {".md", ".py", ".pyi", ".sh", ".c", ".h", ".cpp", ".txt", ".json", ".toml", ".yml", ".yaml", ".cfg",
                 ".ini", ""}
ORDINALS = r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th)"
HISTORY = {
    "a numbered work item": r"\bissues?[\s-]*#?\s*\d+",
    "a wave": rf"(?<!test-)\bwaves?[\s-]*\d+|\b(?:this|that|next|last|previous|earlier|{ORDINALS})\s+waves?\b|\bwaves'",
    "a working session": rf"\b(?:{ORDINALS}|this|that|same|earlier|previous|last|next|other)\s+sessions?\b"
                         r"|\bsessions?\s+running\s+test",
    "the lead": r"\bthe\s+lead\b|\blead's\b",
    "helpers' runs": r"\bhelpers'|\bother\s+helpers\b|\bhelpers?\s+(?:ran|worked)\b|\ba\s+helper's\s+jobs\b",
}
PATTERN = re.compile("|".join(f"(?P<g{i}>{p})" for i, p in enumerate(HISTORY.values())), re.IGNORECASE)
KINDS = list(HISTORY)


def scanned_files() -> list[Path]:
    """Text files under the scope, this module excepted (it has to spell the phrases it bans)."""
    files = []
    for entry in SCOPE:
        path = REPO / entry
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in candidates:
            if "__pycache__" in file.parts or file.suffix not in TEXT_SUFFIXES or file == Path(__file__).resolve():
                continue
            files.append(file)
    return files


def history_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, the matched words) for each match in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in PATTERN.finditer(line):
            kind = KINDS[int(match.lastgroup[1:])]
            found.append((number, kind, match.group(0)))
    return found


HISTORY_SAMPLES = [
    "Fourth session: prefetch overlapped", "measured in the fifth session's run", "lent to this session",
    "the lead, at the end", "helpers' runs on the busy machine", "while other helpers ran their tests",
    "wave 3's redesign", "Wave 2: real-shaped fixtures", "changes in this wave", "issue 24", "(issue #24)",
    "issues 24 and 27", "every issue-24/27 branch"]
PRODUCT_SAMPLES = [
    "libfuse ends the session at once on SIGINT", "a FUSE session", "session = boto3.session.Session()",
    "ssl_session_cache shared:tls:1m;", "sudo ckptfs install-mount-helper", "the helper's read callback",
    "the mount(8) helper", "this helper runs the installed ckptfs", "pip install -e '.[test-oracles]'",
    "wavelengths 16 to 64", "long_wave, short_wave", "leading zeros", "an issue with the header"]


@pytest.mark.parametrize(("text", "is_history"), [(t, True) for t in HISTORY_SAMPLES] +
                         [(t, False) for t in PRODUCT_SAMPLES])
def test_history_phrases_are_caught_and_product_words_allowed(text, is_history):
    assert bool(history_lines(text)) is is_history, text


def test_no_account_of_how_it_was_built():
    offending = []
    for file in scanned_files():
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        offending += [f"{file.relative_to(REPO)}:{number}: {kind}: {words!r}"
                      for number, kind, words in history_lines(text)]
    assert not offending, f"{len(offending)} lines tell how the project was built:\n" + "\n".join(offending)
