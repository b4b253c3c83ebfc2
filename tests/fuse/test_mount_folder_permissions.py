"""A folder mount keeps the folder's walls (docs/mount.md, "Permissions"): through ``-o allow_other`` a second
user reads exactly what they could read without the mount, and a file replaced after the mount is never
served, nor are its views.

The second user is a real one: a uid and gid no account uses, entered with ``setpriv --reuid --regid
--clear-groups``. What they may read is asked of the kernel both ways, directly in the folder and through the
mount (``cat``, ``ls``), and the answers must agree; a file they may read has the same bytes both ways.
Symlinks: one planted in the folder that leads outside it (to a 0600 file) is not in the mount; one that stays
inside the folder is, as are the links of a Hugging Face cache snapshot (``snapshots/REV/* -> ../../blobs/*``).
A view made from several files (``gguf/model.gguf``: the weights, config and tokenizer files) is readable only
by those who read them all, and never embeds a file the listing leaves out; a folder below a 0700 folder is
closed to them through the mount as it is without it; a ``chmod`` after the mount is honoured within the
documented bound (``ATTR_TIMEOUT_S`` + ``MODES_TTL_S``: the test waits that long, it asserts no speed).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import stat
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ckptfs_cli, cli_env
from fixtures import write_gguf
from multifile_sets import hf_cache_layout, safetensors_tensors, write_safetensors_set
from users import public_dir  # noqa: F401 - the fixture: a folder other users can traverse

from ckptfs.service.options import ATTR_TIMEOUT_S
from ckptfs.sources.local import LocalFolder
from ckptfs.tree.ownership import MODES_TTL_S

#: how long a chmod may take to show through a mount (docs/mount.md), and a margin for the clock's ticks
HONOURED_WITHIN_S = ATTR_TIMEOUT_S + MODES_TTL_S + 0.5


def _free_id(taken) -> int:
    for candidate in range(42000, 43000):
        try:
            taken(candidate)
        except KeyError:
            return candidate
    pytest.fail("no free id in 42000..42999")


@pytest.fixture(scope="module")
def stranger() -> list[str]:
    """The command prefix that runs a program as a user no account names (no supplementary groups)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another user")
    return ["setpriv", f"--reuid={_free_id(pwd.getpwuid)}", f"--regid={_free_id(grp.getgrgid)}", "--clear-groups"]


def as_stranger(stranger: list[str], *command: str) -> subprocess.CompletedProcess:
    return subprocess.run([*stranger, *command], capture_output=True, timeout=60)


def readable(stranger: list[str], path: Path) -> bytes | None:
    """What the stranger reads from ``path`` (a file: its bytes; a folder: its listing), or None if refused."""
    result = as_stranger(stranger, "ls", "-A", str(path)) if path.is_dir() else as_stranger(stranger, "cat", str(path))
    if result.returncode != 0:
        assert b"Permission denied" in result.stderr, result.stderr
        return None
    return result.stdout


def place(public_dir: Path, name: str) -> Path:
    """A mountpoint in ``public_dir`` (the stranger must reach the mount)."""
    (public_dir / name).mkdir()
    return public_dir / name


def write_folder(folder: Path, outside: Path) -> None:
    """A model folder: two shards and an index, one shard 0600; config.json 0644, secret.json 0600; a link
    leading outside the folder (to a 0600 file) and one leading into a sub-folder of it."""
    write_safetensors_set(folder, safetensors_tensors(2))
    (folder / "model-00002-of-00002.safetensors").chmod(0o600)
    (folder / "config.json").write_text('{"model_type": "test"}')
    (folder / "config.json").chmod(0o644)
    (folder / "secret.json").write_text('{"token": "hunter2"}')
    (folder / "secret.json").chmod(0o600)
    outside.write_text("root's eyes only\n")
    outside.chmod(0o600)
    os.symlink(outside, folder / "shadow.txt")
    (folder / "sub").mkdir()
    (folder / "sub" / "notes.txt").write_text("inside\n")
    os.symlink("sub/notes.txt", folder / "notes.txt")
    folder.chmod(0o755)


def test_a_second_user_reads_through_the_mount_only_what_they_can_read(public_dir, stranger, mounted):
    folder = public_dir / "model"
    write_folder(folder, public_dir / "outside-secret.txt")
    mnt = mounted(folder, "-o", "allow_other", mountpoint=place(public_dir, "mnt"))
    names = sorted(os.listdir(mnt))
    assert "shadow.txt" not in names and "notes.txt" in names  # the link leading out is left out
    for name in ("config.json", "secret.json", "notes.txt", "model.safetensors.index.json",
                 "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        direct, through = readable(stranger, folder / name), readable(stranger, mnt / name)
        assert direct == through, name
    assert readable(stranger, mnt / "secret.json") is None and readable(stranger, mnt / "config.json") is not None
    secret = os.stat(mnt / "secret.json")
    assert (stat.S_IMODE(secret.st_mode), secret.st_uid, secret.st_gid) == (0o400, 0, 0)
    # each tensor's views carry the mode of the shard it is stored in; metadata.json needs both shards
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    for tensor, shard in weight_map.items():
        may_read_shard = readable(stranger, folder / shard) is not None
        for suffix in (".npy", ".raw", ".meta.json"):
            got = readable(stranger, mnt / (tensor + suffix))
            assert (got is not None) == may_read_shard, (tensor, suffix)
            if got is not None:
                assert got == (mnt / (tensor + suffix)).read_bytes()
    assert readable(stranger, mnt / "metadata.json") is None
    assert readable(stranger, mnt) is not None  # the folder is 0755: its listing is theirs to read


def test_a_repository_and_a_single_file_keep_their_files_modes(public_dir, stranger, mounted):
    folder = public_dir / "repo"
    folder.mkdir()
    folder.chmod(0o755)
    write_gguf(folder / "open.gguf", {"a": (np.arange(8, dtype=np.float32), "F32")})
    write_gguf(folder / "closed.gguf", {"b": (np.arange(4, dtype=np.float32), "F32")})
    (folder / "open.gguf").chmod(0o644)
    (folder / "closed.gguf").chmod(0o600)
    mnt = mounted(folder, "-o", "allow_other", mountpoint=place(public_dir, "mnt"))
    assert sorted(os.listdir(mnt)) == ["closed", "closed.gguf", "open", "open.gguf"]
    for name in ("open.gguf", "closed.gguf"):
        assert readable(stranger, mnt / name) == readable(stranger, folder / name), name
    assert readable(stranger, mnt / "open" / "a.npy") == (mnt / "open" / "a.npy").read_bytes()
    assert readable(stranger, mnt / "closed") is None  # a checkpoint's folder: r-x for those who read its file
    assert stat.S_IMODE(os.stat(mnt / "closed").st_mode) == 0o500
    assert stat.S_IMODE(os.stat(mnt / "closed" / "b.npy").st_mode) == 0o400
    # a single file: its files carry the file's mode; the mount's root is r-x for its readers
    single = mounted(folder / "closed.gguf", "-o", "allow_other", mountpoint=place(public_dir, "mnt1"))
    assert stat.S_IMODE(os.stat(single).st_mode) == 0o500
    assert stat.S_IMODE(os.stat(single / "b.npy").st_mode) == 0o400
    assert readable(stranger, single) is None


def _replace(path: Path, write) -> None:
    """Put another file at ``path`` (written beside it, renamed over it), as a download tool would."""
    fresh = path.with_name(path.name + ".new")
    write(fresh)
    os.replace(fresh, path)


def test_files_replaced_after_the_mount_are_never_served(tmp_path, mounted):
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gguf(repo / "first.gguf", {"a": (np.ones(8, np.float32), "F32")})
    write_gguf(repo / "second.gguf", {"b": (np.ones(8, np.float32), "F32")})
    model = tmp_path / "model"
    model.mkdir()
    write_gguf(model / "m.gguf", {"w": (np.ones(8, np.float32), "F32")})
    (model / "tokenizer.json").write_text('{"old": true}')
    repo_mnt, model_mnt = mounted(repo), mounted(model)
    # replaced before anything of them was read: a checkpoint of other tensors, a config of other bytes
    _replace(repo / "second.gguf", lambda p: write_gguf(p, {"c": (np.zeros(8, np.float32), "F32")}))
    _replace(model / "tokenizer.json", lambda p: p.write_text('{"new": true}'))
    for path in (repo_mnt / "second.gguf", repo_mnt / "second", model_mnt / "tokenizer.json"):
        with pytest.raises(OSError) as failed:
            os.listdir(path) if path.name == "second" else path.read_bytes()
        assert failed.value.errno == 5, path  # EIO
    assert (repo_mnt / "first" / "a.npy").exists()  # the other checkpoint is untouched
    np.testing.assert_array_equal(np.load(repo_mnt / "first" / "a.npy"), np.ones(8, np.float32))


def test_links_stay_inside_the_folder_or_its_hugging_face_cache(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_bytes(b"x")
    snapshot = hf_cache_layout(tmp_path / "hub" / "models--org--name", source)
    (tmp_path / "elsewhere.txt").write_text("no")
    os.symlink(tmp_path / "elsewhere.txt", snapshot / "elsewhere.txt")
    os.symlink("../../../../elsewhere.txt", snapshot / "climbing.txt")
    assert sorted(LocalFolder(str(snapshot)).list()) == ["config.json", "model.safetensors"]


def test_an_index_file_replaced_after_the_mount_closes_its_folder(tmp_path, mounted):
    """A repository of two index files: the one replaced after the mount (now naming other shards) is read
    and closed when its checkpoint is opened, so it is checked against its stamp by its path."""
    folder = tmp_path / "two"
    write_safetensors_set(folder, safetensors_tensors(2))
    write_safetensors_set(folder, safetensors_tensors(1, seed=4), prefix="other",
                          index_name="other.safetensors.index.json")
    mnt = mounted(folder)
    assert {"model", "other"} <= set(os.listdir(mnt))
    index = folder / "other.safetensors.index.json"
    doc = json.loads(index.read_text())
    _replace(index, lambda p: p.write_text(json.dumps({**doc, "metadata": {"total_size": 1}})))
    with pytest.raises(OSError) as failed:
        os.listdir(mnt / "other")
    assert failed.value.errno == 5  # EIO
    assert "model.safetensors.index.json" not in os.listdir(mnt / "model")  # the other one opens


def test_a_view_of_several_files_is_readable_by_those_who_read_them_all():
    from ckptfs.sources.local import FileStamp
    from ckptfs.tree.ownership import Ownership, as_folder, combined

    def stamp(uid, gid, mode):
        return FileStamp(1, 2, 3, 4, uid, gid, stat.S_IFREG | mode)

    assert combined([stamp(5, 6, 0o644), stamp(5, 6, 0o640)]) == Ownership(5, 6, 0o440)
    assert combined([stamp(5, 6, 0o600), stamp(5, 6, 0o755)]) == Ownership(5, 6, 0o400)
    # other owners: owning the first file says nothing of the second; only what both grant to all counts
    assert combined([stamp(5, 6, 0o600), stamp(7, 6, 0o644)]) == Ownership(5, 6, 0)
    assert combined([stamp(5, 6, 0o644), stamp(7, 8, 0o604)]) == Ownership(5, 6, 0o444)
    assert combined([stamp(5, 6, 0o644), stamp(7, 6, 0o640)]) == Ownership(5, 6, 0o040)
    assert as_folder(Ownership(5, 6, 0o440)) == Ownership(5, 6, 0o550)
    assert combined([FileStamp.MISSING, stamp(5, 6, 0o644)]).perm == 0


def _open_folder(folder: Path, shards: int) -> Path:
    """A model folder of ``shards`` safetensors shards and a config.json, all 0644, the folder 0755."""
    write_safetensors_set(folder, safetensors_tensors(shards))
    (folder / "config.json").write_text('{"model_type": "test"}')
    for path in folder.iterdir():
        path.chmod(0o644)
    folder.chmod(0o755)
    return folder


def _chmod_and_wait(path: Path, mode: int) -> None:
    path.chmod(mode)
    time.sleep(HONOURED_WITHIN_S)


def test_a_chmod_after_the_mount_is_honoured(public_dir, stranger, mounted):
    folder = _open_folder(public_dir / "model", 2)
    mnt = mounted(folder, "-o", "allow_other", mountpoint=place(public_dir, "mnt"))
    shard = "model-00001-of-00002.safetensors"
    tensor = next(t for t, s in json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].items()
                  if s == shard)
    watched = (mnt / "config.json", mnt / shard, mnt / f"{tensor}.npy", mnt / "metadata.json")
    assert all(readable(stranger, path) is not None for path in watched)
    _chmod_and_wait(folder / "config.json", 0o600)
    _chmod_and_wait(folder / shard, 0o600)
    assert readable(stranger, folder / "config.json") is None
    assert all(readable(stranger, path) is None for path in watched), [readable(stranger, p) for p in watched]
    assert readable(stranger, mnt / "model-00002-of-00002.safetensors") is not None
    _chmod_and_wait(folder / "config.json", 0o644)
    assert readable(stranger, mnt / "config.json") == (folder / "config.json").read_bytes()


def test_a_folder_below_a_closed_folder_stays_closed(public_dir, stranger, mounted):
    parent = public_dir / "p"
    parent.mkdir(mode=0o700)
    folder = _open_folder(parent / "m", 1)
    parent.chmod(0o700)
    mnt = mounted(folder, "-o", "allow_other", mountpoint=place(public_dir, "mnt"))
    tensor = next(name for name in os.listdir(mnt) if name.endswith(".npy"))
    for name in ("config.json", "model.safetensors", tensor, "metadata.json"):
        assert readable(stranger, folder / name) is None, name
        assert readable(stranger, mnt / name) is None, name
    assert readable(stranger, mnt) is None
    assert stat.S_IMODE(os.stat(mnt).st_mode) == 0o500  # the folder's 0755, walled in by its 0700 parent
    _chmod_and_wait(parent, 0o755)  # opened: the mount follows
    assert readable(stranger, mnt / "config.json") == (folder / "config.json").read_bytes()
    assert stat.S_IMODE(os.stat(mnt).st_mode) == 0o555


@pytest.fixture
def llama_folder(public_dir) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from gguf_view_models import make_llama

    folder = make_llama(public_dir / "tiny-llama")
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")  # read by the view as the folder's other files are
    for path in folder.iterdir():
        path.chmod(0o644)
    folder.chmod(0o755)
    return folder


def test_the_gguf_view_is_no_more_open_than_each_file_it_is_made_from(llama_folder, public_dir, stranger,
                                                                       mounted):
    mnt = mounted(llama_folder, "--gguf", "-o", "allow_other", mountpoint=place(public_dir, "mnt"))
    view = mnt / "gguf" / "model.gguf"
    assert readable(stranger, view) == view.read_bytes()
    for name in ("tokenizer.json", "config.json", "vocab.txt"):
        _chmod_and_wait(llama_folder / name, 0o600)
        assert readable(stranger, llama_folder / name) is None
        assert readable(stranger, view) is None, name
        assert stat.S_IMODE(os.stat(view).st_mode) == 0o400, name
        _chmod_and_wait(llama_folder / name, 0o644)
        assert readable(stranger, view) is not None, name
    # mounted with a 0600 tokenizer.json: closed from the start
    (llama_folder / "tokenizer.json").chmod(0o600)
    closed = mounted(llama_folder, "--gguf", "-o", "allow_other", mountpoint=place(public_dir, "mnt2"))
    assert readable(stranger, closed / "gguf" / "model.gguf") is None


def test_a_file_the_listing_leaves_out_is_never_read_into_a_view(llama_folder, public_dir, stranger,
                                                                  mounted):
    from tokenizers import Tokenizer

    outside = public_dir / "outside-tokenizer.json"
    planted = Tokenizer.from_file(str(llama_folder / "tokenizer.json"))
    planted.add_special_tokens(["<|hunter2-planted|>"])
    planted.save(str(outside))
    outside.chmod(0o600)
    (llama_folder / "tokenizer.json").unlink()
    os.symlink(outside, llama_folder / "tokenizer.json")
    mnt = place(public_dir, "mnt")
    refused = subprocess.run([*ckptfs_cli(), "mount", str(llama_folder), str(mnt), "--gguf"], env=cli_env(),
                             capture_output=True, text=True, timeout=120)
    if refused.returncode == 0:  # a view without that tokenizer, if it could be built from the other files
        try:
            assert b"hunter2-planted" not in (mnt / "gguf" / "model.gguf").read_bytes()
        finally:
            subprocess.run([*ckptfs_cli(), "umount", str(mnt)], env=cli_env(), timeout=60)
    else:  # the view is made from what the listing holds: there is no tokenizer
        assert "has no tokenizer" in refused.stderr, refused.stderr
    assert "hunter2" not in refused.stderr
    plain = mounted(llama_folder, "-o", "allow_other", mountpoint=place(public_dir, "plain"))
    assert "tokenizer.json" not in os.listdir(plain)
