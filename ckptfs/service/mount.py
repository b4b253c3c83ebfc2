"""``ckptfs mount`` / ``ckptfs umount``: checks, daemon or foreground, logging, exit codes.

Everything that can be checked before forking is (options, mountpoint, /dev/fuse, the binding, opening the
checkpoint itself), so the usual mistakes are one line and a non-zero exit at once. Opening the checkpoint
starts no thread, so the parent's open checkpoint is handed to the daemon through fork rather than parsed
twice.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckptfs.cache.folder import PRUNE_HOLD
from ckptfs.core.runtime import runtime
from ckptfs.checkpoint.api import OpenOptions, open_with, source_plan
from ckptfs.formats.repository import SeveralCheckpoints
from ckptfs.tree.layout import tensor_providers
from ckptfs.tree.mount_tree import MountTree
from ckptfs.tree.registry import providers_for
from ckptfs.fuse.binding import Binding, load_binding
from ckptfs.service import logs
from ckptfs.fuse.counters import MountCounters
from ckptfs.service.daemon import READY_TIMEOUT, ReadinessPipe, StderrCapture, detach
from ckptfs.fuse.errors import MountError
from ckptfs.service.mountpoint import (MountGone, MountpointLock, check_answers, check_dev_fuse, check_fusermount,
                                  check_mountpoint, unmount)
from ckptfs.fuse.operations import CkptOperations
from ckptfs.service.options import MountOptions, as_usage_error, parse_options
from ckptfs.util.redact import strip_url
from ckptfs.core.options import absolute

if TYPE_CHECKING:  # imported when a folder of several checkpoints is mounted
    from ckptfs.ahead.warmup import BackgroundWarmup
    from ckptfs.checkpoint.api import Checkpoint
    from ckptfs.formats.repository import Member, Repository
    from ckptfs.sources import ByteSource
    from ckptfs.tree.mount_tree import Provider
    from ckptfs.tree.repository import RepositoryTree

__all__ = ["MountRequest", "MountError", "run_mount", "unmount"]

log = logging.getLogger("ckptfs.mount")
ANSWER_TIMEOUT = 10.0  # seconds for a new mount's root to answer before the mount counts as failed


@dataclass
class MountRequest:
    """What ``ckptfs mount`` was asked for (``options``: every ``-o`` value, comma-joined)."""

    src: str
    mountpoint: str
    foreground: bool = False
    options: str = ""
    #: how the checkpoint is opened and read: dtype, cache tiers, manifest, mirrors, timeouts (ckptfs.core.options)
    open_options: OpenOptions = OpenOptions()
    log_file: str | None = None
    verbose: bool = False
    hf: bool = False  # add hf/ (a Hugging Face folder: a GGUF's, or a quantized folder's release)
    hf_dtype: str = "bfloat16"  # dtype of hf/'s safetensors files
    gguf: bool = False  # add gguf/model.gguf (the converter's GGUF) to a Hugging Face folder's mount
    gguf_type: str = "auto"  # its output type: auto, f32, f16, bf16, q8_0
    gguf_fp8_as_q8: bool = False  # a quantized folder's FP8 layers in Q8_0 (the converter's --fp8-as-q8)
    log_format: str = "text"
    metrics: str | None = None  # [HOST:]PORT of the Prometheus exporter
    layout: str = "flat"  # --layout: "tree" makes dotted tensor names folders (ckptfs.tree.layout)
    prefetch: bool = False  # --prefetch: every stored byte into --cache-dir in the background once mounted


@dataclass(frozen=True)
class _Plan:
    request: MountRequest
    mountpoint: str
    options: MountOptions
    binding: Binding
    tree: MountTree | RepositoryTree  # one checkpoint, or a folder of several (each its own MountTree)
    log_file: logs.LogFile | None
    metrics: tuple[str, int] | None
    #: the background warm-up once ``--prefetch`` started it (``ckptfs stats`` shows its progress)
    warmups: list[BackgroundWarmup] = field(default_factory=list, compare=False)

    @property
    def log_fd(self) -> int | None:
        return None if self.log_file is None else self.log_file.fd


def run_mount(request: MountRequest) -> int:
    """Mount and return the exit code: in the foreground once unmounted, else once the daemon is ready.

    Failures raise MountError (its ``exit_code`` is 2 for refused options) or CheckpointError, which the
    CLI prints as one line.
    """
    # The command line, which ps shows every user for the daemon's whole life (it is forked from this
    # process), had the secrets of its URLs redacted at the command's entry (commands/cli.py).
    if request.foreground:
        return _mount(request)
    # The daemon is forked after the open, and a fork needs a single thread: the open's first writes into
    # --cache-dir make a prune due, whose thread the daemon starts instead (``_run_daemon``). This process
    # stops holding whatever happened (a refused source, a failed start, a daemon that is up): a process
    # that goes on after ``run_mount`` (the Python API, a test) would otherwise never prune those stores again.
    prunes = runtime().get(PRUNE_HOLD)
    prunes.hold()
    try:
        return _mount(request)
    finally:
        prunes.release()


def _mount(request: MountRequest) -> int:
    # One mount at a time per mountpoint: a second waits for the first, then finds the place taken.
    with MountpointLock(request.mountpoint, READY_TIMEOUT) as lock:
        plan = _prepare(request)
        try:
            if request.foreground:
                return _run_foreground(plan, lock)
            detach(lambda pipe: _run_daemon(plan, pipe), in_child=lock.close_inherited,
                   verify=lambda pid: check_answers(plan.mountpoint, pid, ANSWER_TIMEOUT))
        except MountError as exc:
            raise as_usage_error(exc) from None
    return 0


def _prepare(request: MountRequest) -> _Plan:
    """Every check that can be made before forking, cheapest and most likely first."""
    request = _resolved(request)
    options = parse_options(request.options)
    mountpoint = check_mountpoint(request.mountpoint, allow_nonempty=options.nonempty)
    check_dev_fuse()
    binding = load_binding()
    check_fusermount(binding.fusermount)
    metrics = _metrics_address(request.metrics)
    log_file = _open_log(request.log_file)
    logs.configure_startup(request.log_format, None if log_file is None else log_file.fd)
    tree: MountTree | RepositoryTree
    try:
        checkpoint = open_with(request.src, request.open_options)
    except SeveralCheckpoints as several:  # a folder of several checkpoints: mounted whole
        tree = _repository_tree(request, several.repository)
    else:
        try:
            tree = MountTree(checkpoint, providers=tensor_providers(request.layout),
                             extra=_virtual_files(request, required=True))
        except BaseException:  # a requested view that cannot be built: the mount fails with its line
            checkpoint.close()
            raise
    return _Plan(request, mountpoint, options, binding, tree, log_file, metrics)


def _repository_tree(request: MountRequest, repository: Repository) -> RepositoryTree:
    """The tree of a repository folder (ckptfs.tree.repository): its files through a pool with the request's
    remote options and mirrors, each checkpoint opened with the request's options on first access (a folder
    mirror gives each member file its own mirror, the file of the same name there)."""
    import time

    from ckptfs.sources import SourcePool
    from ckptfs.tree.repository import RepositoryTree

    src, options = request.src, request.open_options
    if options.manifest is not None:
        raise MountError(f"--manifest describes one checkpoint and {_mount_name(src)} holds "
                         f"{len(repository.members)}: mount the file it describes", exit_code=2)
    plan = source_plan(src, options)
    pool = SourcePool(options.max_open_files, opener=plan.opener if plan is not None else None,
                      wrapper=plan.wrapper() if plan is not None else None)
    mirror_set = None
    if options.mirrors:
        from ckptfs.sources.mirror import MirrorSet

        mirror_set = MirrorSet(repository.folder, list(options.mirrors), is_folder=True)

    def open_member(member: Member) -> Checkpoint:
        mirrors = tuple(mirror_set.mirror_name(member.src, m) for m in options.mirrors) if mirror_set else ()
        return open_with(member.src, OpenOptions.build(options, mirrors=mirrors))

    for note in repository.notes:
        log.warning("%s: %s", _mount_name(src), note)
    mtime_ns = time.time_ns() if "://" in src else os.stat(repository.folder).st_mtime_ns
    return RepositoryTree(repository, open_member, pool, providers=tensor_providers(request.layout),
                          extra=_virtual_files(request), cache_capacity=options.cache_size,
                          read_scope=plan.read_scope if plan is not None else None, mtime_ns=mtime_ns)


def _resolved(request: MountRequest) -> MountRequest:
    """The request with SRC and the log file named absolutely (``~`` expanded, links kept; the open options'
    paths are absolute already, ``OpenOptions.build``): the daemon runs in ``/`` and opens files long after
    this (the shards behind model.gguf, the log file when reopened), and logs SRC by this name."""
    def local(path: str) -> str:
        path = absolute(os.fspath(path))
        # "." components and doubled slashes go (safe after a link too); a name with ".." stays as given
        return path if "://" in path or ".." in path.split("/") else os.path.normpath(path)

    log_file = None if request.log_file is None else local(request.log_file)
    return dataclasses.replace(request, src=local(request.src), log_file=log_file)


def _virtual_files(request: MountRequest, required: bool = False) -> list[Provider]:
    """The file views' providers after the defaults (``tree.registry``): those of every mount (model.gguf of
    a split GGUF set), hf/ and gguf/ when asked for (``required``: of the one checkpoint mounted, whose view
    not built fails the mount; a repository's members are served without theirs, with one line:
    ``tree.optional``). A view's module is imported only when it is asked for."""
    wanted: dict[str, dict[str, object]] = {}
    if request.hf:
        wanted["hf"] = {"dtype": request.hf_dtype}
    if request.gguf:
        wanted["gguf"] = {"output_type": request.gguf_type, "fp8_as_q8": request.gguf_fp8_as_q8}
    return providers_for(wanted, required)


def _metrics_address(spec: str | None) -> tuple[str, int] | None:
    """``--metrics``, checked before forking: the address, and prometheus-client importable (one line if not)."""
    if spec is None:
        return None
    try:
        from ckptfs.service.metrics import parse_address
    except ImportError:
        raise MountError("--metrics needs prometheus-client: pip install 'ckptfs[metrics]'") from None
    return parse_address(spec)


def _open_log(path: str | None) -> logs.LogFile | None:
    if path is None:
        return None
    try:
        return logs.LogFile(path)
    except OSError as exc:
        raise MountError(f"cannot open log file {path}: {exc.strerror}") from None


def _serve(plan: _Plan, on_ready: Callable[[], None]) -> BaseException | None:
    """Run FUSE until unmounted; the exception it ended with, if any."""
    describe = {"binding": plan.binding.name, "libfuse": plan.binding.libfuse_major, "mountpoint": plan.mountpoint}
    if plan.request.prefetch:
        # "prefetch": the key's older name, kept as an alias (docs/remote.md)
        describe["warmup"] = describe["prefetch"] = lambda: _warmup_status(plan)
    operations = CkptOperations(plan.tree, on_ready, describe=describe,
                                counters=MountCounters(timed=plan.metrics is not None), runtime=runtime())
    if plan.log_file is not None:
        plan.log_file.reopen_on_signal()
    if plan.metrics is not None:
        error = _start_exporter(plan, operations)
        if error is not None:
            return error
    try:
        plan.binding.serve(operations, plan.mountpoint,
                           plan.options.for_libfuse(_mount_name(plan.request.src), plan.binding.libfuse_major))
    except Exception as exc:  # noqa: BLE001 - turned into a one-line reason or an exit code by the caller
        return exc
    return None


def _start_exporter(plan: _Plan, operations: CkptOperations) -> MountError | None:
    """The Prometheus exporter, in the process that serves (after the fork); its address goes into the stats."""
    from ckptfs import __version__
    from ckptfs.sources import scheme_of
    from ckptfs.service.metrics import start_exporter

    src = plan.request.src
    scheme = scheme_of(src)
    info = {"version": __version__, "binding": plan.binding.describe(),
            "source": strip_url(src), "scheme": scheme or "file"}
    assert plan.metrics is not None  # called only with --metrics
    try:
        host, port = start_exporter(*plan.metrics, operations, info)
    except MountError as exc:
        return exc
    operations.describe("metrics", f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return None


def _start_warmup(plan: _Plan) -> list[BackgroundWarmup]:
    """``--prefetch``: the background warm-up of the mounted checkpoint's stored bytes, started (none when not
    asked for). A folder of several checkpoints has one per checkpoint, each started when the one before
    it ends; a checkpoint not opened yet is opened by its warm-up."""
    if not plan.request.prefetch:
        return []
    from ckptfs.sources.remote.warmup import background, for_checkpoint

    tree = plan.tree
    if isinstance(tree, MountTree):
        plan.warmups.append(for_checkpoint(tree.checkpoint, _mount_name(plan.request.src)))
    else:  # a RepositoryTree
        for index, member in enumerate(tree.repository.members):
            member_sources = functools.partial(_member_sources, tree, index)
            plan.warmups.append(background(member_sources, member.name))
    before = None
    for warmup in plan.warmups:
        before = warmup.start(after=before)
    return list(plan.warmups)


def _member_sources(tree: RepositoryTree, index: int) -> list[ByteSource]:
    """The sources of member ``index`` of a repository, its checkpoint opened now (by its warm-up's thread)."""
    from ckptfs.sources.remote.warmup import checkpoint_sources

    return checkpoint_sources(tree.member_tree(index).checkpoint)


def _warmup_status(plan: _Plan) -> dict[str, Any]:
    """``--prefetch``'s entry in the mount's stats: the warm-up's state and progress, read when asked (a
    repository's: each checkpoint's under ``checkpoints``, and their sums)."""
    if not plan.warmups:
        return {"state": "starting"}
    if isinstance(plan.tree, MountTree):
        return plan.warmups[0].status()
    from ckptfs.ahead.warmup import combined_status

    return combined_status({warmup.name: warmup for warmup in plan.warmups})


def _describe(plan: _Plan) -> str:
    return f"{_mount_name(plan.request.src)} at {plan.mountpoint} ({plan.binding.describe()})"


def _mount_name(src: str) -> str:
    """The source as the mount table and the log show it: a path made absolute; a URL without its query or
    user info (the mount table is world-readable, and a presigned URL's signature is a credential)."""
    return strip_url(src) if "://" in src else os.path.abspath(src)


def _failure_reason(capture: StderrCapture, error: BaseException | None) -> str:
    """libfuse's own last message if it printed one (its RuntimeError only carries a status number)."""
    return capture.last_line() or (str(error) if error is not None else "") or "FUSE exited before the mount was ready"


class _StartupCheck:
    """A foreground mount's start-up check (``check_answers``) and its outcome.

    It runs on a thread of its own, started by ``init`` (not from ``init`` itself, whose reply the kernel is
    still waiting for), while the session serves, and a termination signal can end the session at any
    moment of it (libfuse's handlers end the loop at once): the check's question then finds the mount gone,
    or is never answered. That is not a mount that failed to start, so the outcome is decided under a lock
    by whichever comes first: the check's ``"ok"``; its ``"failed"`` (the mount answers wrongly: the check
    unmounts it, which ends the session); ``"gone"`` (the mount was gone when the answer came); or, once
    the session has ended with the check still waiting for its answer, ``"moot"`` (``settle``).
    """

    def __init__(self, plan: _Plan, capture: StderrCapture, lock: MountpointLock | None, warmup: list[BackgroundWarmup]):
        self._plan, self._capture, self._lock, self._warmup = plan, capture, lock, warmup
        self._state = threading.Lock()
        self.outcome: str | None = None
        self.reason = ""
        self._thread = threading.Thread(target=self._run, name="ckptfs-check-mount", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _decide(self, outcome: str, reason: str = "") -> bool:
        """Record ``outcome`` unless one is recorded already; True if this one was."""
        with self._state:
            if self.outcome is not None:
                return False
            self.outcome, self.reason = outcome, reason
            return True

    def _run(self) -> None:
        plan = self._plan
        try:
            check_answers(plan.mountpoint, os.getpid(), ANSWER_TIMEOUT)
        except MountGone:
            self._decide("gone")
            return
        except MountError as exc:
            if self._decide("failed", str(exc)):  # raised once the session has ended: the CLI prints it
                try:
                    unmount(plan.mountpoint)  # fails harmlessly when libfuse has already given up
                except MountError:
                    pass
            return
        if not self._decide("ok"):
            return
        self._capture.release()
        if self._lock is not None:
            self._lock.release()
        log.info("mounted %s", _describe(plan))
        self._warmup.extend(_start_warmup(plan))

    def settle(self) -> str:
        """Once the session has ended: the outcome (``"moot"`` if the check was still waiting), after the
        check's own follow-up (the unmount it asked for, releasing stderr) is done."""
        self._decide("moot")
        if self._thread.ident is not None and self.outcome in ("ok", "failed"):
            self._thread.join(ANSWER_TIMEOUT)
        return self.outcome or "moot"


def _run_foreground(plan: _Plan, lock: MountpointLock | None = None) -> int:
    request = plan.request
    logs.configure(logging.DEBUG if request.verbose else logging.WARNING, request.log_format, plan.log_fd)
    capture = StderrCapture()
    mounted = threading.Event()
    warmup: list[BackgroundWarmup] = []
    check = _StartupCheck(plan, capture, lock, warmup)

    def on_ready() -> None:
        mounted.set()
        check.start()

    error = _serve(plan, on_ready)
    for running in warmup:
        running.stop()
    if not mounted.is_set():
        reason = _failure_reason(capture, error)
        capture.release(replay=request.verbose)
        raise MountError(reason)
    outcome = check.settle()
    if outcome == "failed":
        said = capture.last_line()  # libfuse's own reason, when it printed one
        capture.release(replay=request.verbose)
        raise MountError(f"{check.reason}" + (f" ({said})" if said else ""))
    if outcome != "ok":
        # The session ended while the check waited: a signal or an unmount ends it silently (not a failed
        # start), while libfuse giving up after init (``-o max_read`` on libfuse 3) says why on stderr first,
        # in a line of its own prefix.
        said = capture.last_line()
        capture.release(replay=request.verbose)
        if said.startswith("fuse:"):
            raise MountError(f"the mount at {plan.mountpoint} does not answer at its root: not mounted ({said})")
        log.info("ended before its start-up check was answered")
    return _exit_code(plan, error)


def _run_daemon(plan: _Plan, pipe: ReadinessPipe) -> int:
    """The detached child: serve until unmounted or signalled; its exit code."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    after_start = plan.log_fd if plan.log_fd is not None else devnull
    capture = StderrCapture()
    logs.configure(logging.DEBUG if plan.request.verbose else logging.INFO, plan.request.log_format)
    runtime().get(PRUNE_HOLD).release()  # the prunes the open made due before the fork (``run_mount``)

    warmup = []

    def on_ready() -> None:
        capture.release(after_start)
        log.info("mounted %s", _describe(plan))
        pipe.ok()
        warmup.extend(_start_warmup(plan))

    try:
        error = _serve(plan, on_ready)
        for running in warmup:
            running.stop()
        if not pipe.sent:
            pipe.error(_failure_reason(capture, error))
            capture.release(after_start)
            return 1
        return _exit_code(plan, error)
    except BaseException as exc:  # noqa: BLE001 - the daemon must always answer its parent
        pipe.error(f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        logging.shutdown()


# fuse_main_real's status when its session loop ended non-zero. libfuse 3 ends the loop that way after its
# SIGINT/SIGTERM/SIGHUP handler ran (the session's error is the signal number); libfuse 2 returns 0 there.
LIBFUSE3_LOOP_ENDED = 8


def _exit_code(plan: _Plan, error: BaseException | None) -> int:
    """After a successful mount: 0 for an unmount or a termination signal, 1 for a FUSE failure."""
    if error is None or (isinstance(error, RuntimeError) and error.args == (LIBFUSE3_LOOP_ENDED,)
                         and plan.binding.libfuse_major == 3):
        log.info("unmounted %s", plan.mountpoint)
        return 0
    log.error("FUSE stopped: %s: %s", type(error).__name__, error)
    return 1
