"""The way to a ``--cache-dir``, judged as ssh's StrictModes judges a path: a symbolic link on it owned by
another user (a real second user, nobody, through setpriv), a folder on it another user owns, or one others
may write without the sticky bit, is refused with one line before anything is written at the target; a
link of root's or the caller's in a sticky folder (``/tmp``) is fine."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_runs import one_error_line, run_cli
from conftest import force_unmount
from tier_models import write_model
from users import AS_NOBODY
from users import public_dir as _public_dir

import ckptfs
from ckptfs.cache.auth import CacheRefused

public_dir = _public_dir  # the fixture (root, setpriv), made sticky below


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.gguf"
    write_model(path, seed=48)
    return path


@pytest.fixture
def sticky_dir(public_dir) -> Path:
    """A world-writable sticky folder, as /tmp is."""
    public_dir.chmod(0o1777)
    return public_dir


@pytest.fixture
def mine(tmp_path) -> Path:
    """The caller's own cache folder, 0700, reached below through the links under test."""
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o700)
    return folder


def as_nobody(*command: str) -> None:
    result = subprocess.run([*AS_NOBODY, *command], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr


def refused(model: Path, cache: Path, tmp_path: Path, *words: str) -> None:
    """``cache`` refused by the commands (one line, exit 1) and the library, with ``words`` in the reason."""
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    try:
        one_error_line(run_cli("mount", str(model), str(mnt), "--cache-dir", str(cache)), 1, str(cache), *words)
    finally:
        force_unmount(mnt)
    one_error_line(run_cli("prefetch", str(model), "--cache-dir", str(cache)), 1, *words)
    with pytest.raises(CacheRefused, match=words[0]):
        ckptfs.open(model, cache_dir=str(cache))


def test_a_link_another_user_owns_in_a_sticky_folder_is_refused(model, sticky_dir, mine, tmp_path):
    """nobody's link in /tmp-like folder names the caller's own folder: its owner could point it anywhere
    (``fs.protected_symlinks`` may be 0), so it is refused, and no key is written at its target; the same
    link further down a path too."""
    link = sticky_dir / "cache"
    as_nobody("ln", "-s", str(mine), str(link))
    assert link.lstat().st_uid == 65534
    refused(model, link, tmp_path, "symbolic link", str(link), "owned by nobody")
    refused(model, link / "sub", tmp_path, "symbolic link", "owned by nobody")
    assert list(mine.iterdir()) == []


def test_a_link_of_the_callers_in_a_sticky_folder_is_used(model, sticky_dir, mine):
    link = sticky_dir / "cache"
    link.symlink_to(mine)
    with ckptfs.open(model, cache_dir=str(link)):
        pass
    assert (mine / ".key").is_file()
    mnt = sticky_dir / "mnt"
    mnt.mkdir()
    try:
        mounted = run_cli("mount", str(model), str(mnt), "--cache-dir", str(link))
        assert mounted.returncode == 0, mounted.stderr
    finally:
        force_unmount(mnt)


def test_a_folder_another_user_owns_before_a_link_is_refused(model, sticky_dir, mine, tmp_path):
    """nobody's folder holds a link (the caller's own) to the caller's folder: the folder's owner can replace
    the link, so the path is refused though every folder above the target is fine."""
    theirs = sticky_dir / "theirs"
    as_nobody("mkdir", "-m", "0755", str(theirs))
    (theirs / "cache").symlink_to(mine)
    refused(model, theirs / "cache", tmp_path, f"the folder {theirs} above it is owned by nobody")
    assert list(mine.iterdir()) == []


def test_a_folder_others_may_write_before_a_link_is_refused(model, tmp_path, mine):
    """A folder writable by others and not sticky on the way (before a link to the caller's own folder)."""
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    (open_folder / "cache").symlink_to(mine)
    refused(model, open_folder / "cache", tmp_path, f"the folder {open_folder} above it is writable by group "
                                                    f"or others", "chmod go-w")
    assert list(mine.iterdir()) == []
