"""The mount of a repository folder (``formats.repository``): every file of the folder under its own name,
and each checkpoint's views in a folder of its own — a tree of per-checkpoint sub-trees.

Each member folder is the :class:`~ckptfs.tree.mount_tree.MountTree` of that checkpoint alone (tensor files,
``metadata.json``, a split set's ``model.gguf``, ``hf/`` with ``--hf``: the same providers, minus the
checkpoint and pass-through files, which are the repository's own, at its root). A member's Checkpoint is
opened on the first access of its folder or the first read of one of its files, once: a repository of ten
quantizations mounts after one folder listing, and a client that loads one of them opens only that one.

The repository's files are listed with the sizes the folder listing gave, so ``ls -l`` opens nothing. A file
of a checkpoint is read through that checkpoint's pool (the sources its tensors come from, pinned at open:
never a second reader of the same file); the other files (README, config.json, tokenizer files), and those
of a checkpoint that cannot be opened (a damaged header), through the repository's own pool.

Each local file is stamped when the mount is made (``tree.ownership``): its owner and mode are what the mount
shows for it and for the views made from it, and a file replaced or changed after the mount reads as EIO —
the file itself and its checkpoint's folder alike, opened however late. A remote file whose size changed
since the listing reads as EIO.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.core.errors import CheckpointError
from ckptfs.core.reads import NOTHING_SAID, ReadScope
from ckptfs.ahead.decode import Ahead
from ckptfs.engine.views import FileView, View
from ckptfs.formats.repository import Repository
from ckptfs.sources import ByteSource, SourcePool
from ckptfs.tree.mount_tree import DEFAULT_PROVIDERS, RENUMBERED, MountTree, Provider
from ckptfs.tree.ownership import Ownership, Stamps, as_folder, check_pinned, of_file, of_folder
from ckptfs.sources.local import FileStamp, stamp_path

log = logging.getLogger(__name__)


class ListedFileView(View):
    """A repository file with the size its folder listing gave (a local file's: its stamp's); its pool (and so
    a member checkpoint) is only asked for at the first read, or at the first stat when the listing gave no
    size. The file then opened must be the one stamped at mount (a local file), or of the listed size."""

    reads_ahead = True

    def __init__(self, path: str, size: int, pool: Callable[[], SourcePool], stamp: FileStamp | None = None):
        self.path = path
        self._pool = pool
        self._stamp = stamp
        self._view: FileView | None = None
        self._lock = threading.Lock()
        if stamp is not None and stamp is not FileStamp.MISSING:
            size = stamp.size
        self._listed = size
        self.size = size if size >= 0 else self._opened().size

    def _opened(self) -> FileView:
        if self._view is None:
            with self._lock:
                if self._view is None:
                    pool = self._pool()
                    view = FileView(self.path, pool)
                    check_pinned(self.path, pool.get(self.path).identity, self._stamp)
                    if self._listed >= 0 and self._listed != view.size:
                        raise CheckpointError(self.path, None, f"is {view.size} bytes, the folder listing said "
                                                               f"{self._listed}: it changed since the mount")
                    self._view = view
        return self._view

    def read_into(self, offset: int, target: memoryview, keep: bool = True, *, scope: ReadScope = NOTHING_SAID) -> int:
        return self._opened().read_into(offset, target, keep, scope=scope)

    def ahead(self, start: int, stop: int) -> Ahead:
        return self._opened().ahead(start, stop)

    def plain_segments(self) -> list[tuple[int, int, object, int]] | None:
        return self._opened().plain_segments()


class RepositorySources:
    """The pool the mount's read-ahead advises through: each file's own checkpoint's pool, else the
    repository's (a name the read-ahead gives is always one a view has already read)."""

    def __init__(self, tree: RepositoryTree):
        self._tree = tree

    def get(self, path: str) -> ByteSource:
        return self._tree.pool_of(path).get(path)


class CombinedCaches:
    """The member checkpoints' caches, summed, for the mount's stats."""

    def __init__(self, tree: RepositoryTree, capacity: int):
        self._tree = tree
        self.capacity = capacity  # one member's memory tier: what a read-ahead budget is a share of

    def tier_stats(self) -> dict[str, dict]:
        total: dict[str, dict] = {}
        for ck in self._tree.checkpoints():
            for tier, values in ck.cache.tier_stats().items():
                row = total.setdefault(tier, {})
                for key, value in values.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        row[key] = row.get(key, 0) + value
        return total

    def memory_stats(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for ck in self._tree.checkpoints():
            for key, value in ck.cache.stats().as_dict().items():
                total[key] = total.get(key, 0) + value
        return total

    @property
    def decoded_bytes(self) -> int:
        return sum(ck.cache.decoded_bytes for ck in self._tree.checkpoints())


def member_providers(providers: Sequence[Provider] | None) -> list[Provider]:
    """A member folder's providers: the mount's, without the files the repository's root already holds."""
    return [p for p in (providers if providers is not None else DEFAULT_PROVIDERS) if p not in RENUMBERED]


class RepositoryTree:
    """The folders of a repository mount (see the module docstring); the same interface as MountTree.

    ``open_member(member)`` opens one member's Checkpoint (with the mount's options); ``sources`` serves the
    files of no checkpoint; ``providers`` and ``extra`` are a MountTree's (the member folders get them,
    minus the checkpoint and pass-through files).
    """

    def __init__(self, repository: Repository, open_member: Callable, sources: SourcePool, *,
                 providers: Sequence[Provider] | None = None, extra: Sequence[Provider] = (),
                 cache_capacity: int = 0, read_scope=None, mtime_ns: int = 0):
        self.repository = repository
        self._open_member = open_member
        self._pool = sources
        self._providers = member_providers(providers)
        self._extra = list(extra)
        self._members = {m.name: i for i, m in enumerate(repository.members)}
        self._owner = repository.owner()
        self._stamps = Stamps().take([repository.folder, *(path for path, _ in repository.files.values())])
        self._by_path = {path: name for name, (path, _) in repository.files.items()}
        self._trees: list[MountTree | None] = [None] * len(repository.members)
        self._member_locks = [threading.Lock() for _ in repository.members]
        self._hooks: list[Callable[[Checkpoint], None]] = []
        self._lock = threading.Lock()
        self._views: dict[str, View] = {}
        self.sources = RepositorySources(self)
        self.cache = CombinedCaches(self, cache_capacity)
        self.read_scope = read_scope
        self.mtime_ns = mtime_ns
        self._closed = False

    # -- members ---------------------------------------------------------------------------------------

    def member_tree(self, index: int) -> MountTree:
        """The sub-tree of member ``index``, its checkpoint opened on first use (CheckpointError if it cannot
        be: the member's folder then answers EIO, with one log line, and is tried again at the next access)."""
        tree = self._trees[index]
        if tree is not None:
            return tree
        with self._member_locks[index]:
            if self._trees[index] is None:
                if self._closed:
                    raise CheckpointError(self.repository.folder, None, "the mount is closing")
                member = self.repository.members[index]
                ck = self._open_member(member)
                try:
                    self._check_unopened_files(member, ck)
                    tree = MountTree(ck, providers=self._providers, extra=self._extra, stamps=self._stamps)
                    for hook in list(self._hooks):
                        hook(ck)
                except BaseException:
                    ck.close()
                    raise
                log.info("opened %s (%s): %d tensors", member.name, member.label, len(ck.tensors))
                self._trees[index] = tree
                return tree
        opened = self._trees[index]
        assert opened is not None  # set by whoever held the lock first
        return opened

    def _check_unopened_files(self, member, ck: Checkpoint) -> None:
        """The member's files its checkpoint holds no source of (an index file, read and closed at open) must
        still be the files stamped at mount (the MountTree checks the others against their sources)."""
        for name in member.files:
            path = self.repository.files[name][0]
            stamp = self._stamps.get(path)
            if path not in ck.files and stamp is not None:
                check_pinned(path, stamp_path(path).pin, stamp)

    def owner(self, path: str) -> Ownership | None:
        """The owner and permission bits of ``path`` (``tree.ownership``): the folder's own for the root, its
        file's for a file of the folder, r-x for the readers of its files for a checkpoint's folder, the
        member tree's below that; None for a remote repository's."""
        if path == "":
            stamp = self._stamps.now(self.repository.folder)
            return None if stamp is None else self._stamps.walled(of_folder(stamp), self.repository.folder)
        if path in self.repository.files:
            stamp = self._stamps.now(self.repository.files[path][0])
            return None if stamp is None else of_file(stamp, keep_execute=True)
        index = self._members.get(path)
        if index is not None:
            files = self.repository.members[index].files
            readers = self._stamps.readers(self.repository.files[name][0] for name in files)
            return None if readers is None else as_folder(readers)
        split = self._split(path)
        return None if split is None else self.member_tree(split[0]).owner(split[1])

    def checkpoints(self) -> list[Checkpoint]:
        """The member checkpoints opened so far."""
        return [t.checkpoint for t in self._trees if t is not None]

    def each_checkpoint(self, hook: Callable[[Checkpoint], None]) -> None:
        """Call ``hook`` on every member checkpoint: those open now, the others as they are opened."""
        with self._lock:
            self._hooks.append(hook)
        for ck in self.checkpoints():
            hook(ck)

    def pool_of(self, path: str) -> SourcePool:
        """The pool that reads the repository file ``path``: its checkpoint's, else the repository's."""
        name = self._by_path.get(path)
        return self._owner_pool(self._owner.get(name) if name is not None else None)

    def _owner_pool(self, owner: int | None) -> SourcePool:
        """Member ``owner``'s pool; the repository's for a file of no checkpoint, or of one that cannot be
        opened (a damaged header: its files are still the repository's files, served as they are)."""
        if owner is None:
            return self._pool
        try:
            return self.member_tree(owner).checkpoint.sources
        except CheckpointError as exc:
            log.warning("%s: %s; its files are served as plain files", self.repository.members[owner].name, exc)
            return self._pool

    def stored_bytes(self) -> int:
        return sum(max(0, size) for _, size in self.repository.files.values())

    def close(self) -> None:
        self._closed = True
        for ck in self.checkpoints():
            ck.close()
        self._pool.close()

    # -- paths -----------------------------------------------------------------------------------------

    def _split(self, path: str) -> tuple[int, str] | None:
        """(member index, the path inside its folder) for a path in a member folder."""
        head, _, rest = path.partition("/")
        index = self._members.get(head)
        return None if index is None else (index, rest)

    def _root_file(self, name: str) -> View:
        view = self._views.get(name)
        if view is None:
            path, size = self.repository.files[name]
            made = ListedFileView(path, size, functools.partial(self._owner_pool, self._owner.get(name)),
                                  self._stamps.get(path))
            with self._lock:
                view = self._views.setdefault(name, made)
        return view

    def names(self) -> list[str]:
        return self.listdir("") or []

    def listdir(self, folder: str) -> list[str] | None:
        if folder == "":
            return list(self.iter_listdir(""))
        split = self._split(folder)
        return None if split is None else self.member_tree(split[0]).listdir(split[1])

    def iter_listdir(self, folder: str) -> Iterator[str]:
        if folder == "":
            yield from self.repository.files
            yield from self._members
            return
        split = self._split(folder)
        if split is not None:
            yield from self.member_tree(split[0]).iter_listdir(split[1])

    def is_dir(self, path: str) -> bool:
        if path == "" or path in self._members:
            return True
        split = self._split(path)
        return split is not None and self.member_tree(split[0]).is_dir(split[1])

    def kind(self, path: str) -> str | None:
        if path in self.repository.files:
            return "file"
        split = self._split(path)
        return None if split is None or not split[1] else self.member_tree(split[0]).kind(split[1])

    def __contains__(self, path: str) -> bool:
        return self.kind(path) is not None

    def __len__(self) -> int:
        """Files of the root, and of the member folders opened so far (statfs: a count, not a promise)."""
        return len(self.repository.files) + sum(len(t) for t in self._trees if t is not None)

    def view(self, path: str) -> View | None:
        if path in self.repository.files:
            return self._root_file(path)
        split = self._split(path)
        if split is None or not split[1]:
            return None
        return self.member_tree(split[0]).view(split[1])

    def stats(self) -> dict:
        opened = [t for t in self._trees if t is not None]
        return {"cache": self.cache.memory_stats(), "tiers": self.cache.tier_stats(),
                "decoded_bytes": self.cache.decoded_bytes,
                "open_files": self._pool.open_count() + sum(t.checkpoint.sources.open_count() for t in opened),
                "files": len(self),
                "checkpoints": {m.name: self._trees[i] is not None
                                for i, m in enumerate(self.repository.members)}}
