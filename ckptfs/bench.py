"""``ckptfs bench CKPT``: what reading a checkpoint through a ckptfs mount costs, beside what users do today.

The checkpoint is mounted by the real CLI (``python -m ckptfs.cli mount``, a daemon) on a temporary
mountpoint that is always unmounted and removed, also on Ctrl-C or SIGTERM. Measured through the mount,
from this process, the way a user's tools read it: mount-to-ready and ``os.listdir`` (whole processes, as a
user waits for them), the first access to ``metadata.json``, an ``ls -l``-like stat of every file, the very
first 4 KiB read of the largest ``.npy`` in the fresh daemon (stat + open + read, with the daemon's cache-miss
counter before and after to show it was cold), random 4 KiB reads in it (p50, p99), ``np.load`` of one
tensor cold and warm, ``np.load(mmap_mode="r")`` with random rows, and sequential scans of every ``.npy``
and every ``.raw`` with 1 MiB reads (``cat``; ``.raw`` is the mount's transport ceiling), while sampling the
daemon's anonymous memory (RssAnon of it and its children; file-backed pages of the checkpoint are the
kernel's page cache and do not count). A second fresh daemon with ``CKPTFS_PREFETCH=0`` repeats the ``.npy``
scan, so the prefetch gain is measured in the same run.

Where gguf-py or safetensors is installed (``pip install 'ckptfs[bench]'``; imported here lazily, never by
the rest of the package), the same workloads run through it: opening the file as a whole process, decoding
the largest tensor, and decoding every tensor in-process — whose values are compared with what the mount
served in the same run, so a fast wrong answer fails the bench (exit 1). Figures are single measurements on
whatever machine this is; the ratios between them, taken minutes apart, are the meaningful numbers.

A damaged checkpoint is benched on what is intact: damaged tensors (``ckptfs info`` lists them) are left out
of every read and listed with their reason; a reference library that cannot read the damaged file is
reported, not fatal; and a read that fails anyway names the phase, the file and the tensor.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import __version__, procinfo
from .checkpoint import Checkpoint, open as open_checkpoint
from .fs.operations import STATS_XATTR  # the daemon's counters on the mount root (imports no FUSE binding)
from .names import assign_stems
from .oneline import one_line
from .sizes import format_size

SCAN_READ = 1 << 20
PAGE = 4096
RANDOM_READS = 200
RANDOM_ROWS = 200
SAMPLE_TENSOR_MAX = 64 << 20
RSS_SLACK = 100 << 20
SAMPLE_INTERVAL = 0.01
MOUNT_TIMEOUT = 120.0
TARGETS = {"open": 20.0, "random_read": 1000.0, "stream": 2.0}


# -- what to read ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NpyFile:
    """One ``.npy`` the mount serves, and the tensor behind it."""

    file: str
    tensor: str
    storage_type: str
    shape: tuple[int, ...]
    nbytes: int
    data_offset: int


@dataclass(frozen=True)
class Plan:
    """The checkpoint's files and the mount's file names, known before mounting (names are deterministic)."""

    src: str
    format: str
    files: tuple[str, ...]
    stored_bytes: int
    tensors: int
    npy: tuple[NpyFile, ...]
    raw: tuple[str, ...]
    damaged: tuple[tuple[str, str], ...] = ()   # (tensor name, reason): left out of every read
    tensor_of: dict[str, str] = field(default_factory=dict, compare=False)  # mount file name -> tensor name

    @property
    def largest(self) -> NpyFile | None:
        return max(self.npy, key=lambda f: f.nbytes, default=None)

    @property
    def sample(self) -> NpyFile | None:
        """The tensor for the cold/warm fetch: a layer-sized one, the largest .npy of at most 64 MiB."""
        fitting = [f for f in self.npy if f.nbytes <= SAMPLE_TENSOR_MAX and f is not self.largest]
        return max(fitting, key=lambda f: f.nbytes, default=self.largest)


def make_plan(ck: Checkpoint, src: str) -> Plan:
    """What the mount will serve, from the checkpoint opened in-process (the same name assignment as the
    mount's tree). Damaged tensors are left out of the reads (their missing bytes fail by design) and listed."""
    stems = assign_stems([t.name for t in ck.tensors])
    npy, raw, damaged, tensor_of = [], [], [], {}
    for tensor, stem in zip(ck.tensors, stems):
        tensor_of.update({stem + ".raw": tensor.name, stem + ".npy": tensor.name})
        if tensor.info.damaged:
            damaged.append((tensor.name, tensor.info.damaged))
            continue
        if not tensor.virtual:  # a view of packed parts (GPTQ/AWQ) has .npy and .meta.json only
            raw.append(stem + ".raw")
        if tensor.decodable:
            npy.append(NpyFile(stem + ".npy", tensor.name, tensor.storage_type, tuple(tensor.shape),
                               int(tensor.nbytes), int(tensor.meta["npy_data_offset"])))
    files = tuple(ck.files)
    return Plan(src, ck.format, files, sum(os.path.getsize(f) for f in files), len(ck.tensors),
                tuple(npy), tuple(raw), tuple(damaged), tensor_of)


# -- progress ---------------------------------------------------------------------------------------------

class Progress:
    """A bar on stderr when it is a terminal: tqdm if installed, else one plain line redrawn; with -v, one
    line per phase with the time since the start instead (where a long run spends its time)."""

    def __init__(self, total_steps: int, enabled: bool, log_phases: bool = False):
        self._enabled = enabled
        self._log_phases = log_phases
        self._start = time.perf_counter()
        self._total = total_steps
        self._done = 0
        self._label = ""
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total_steps, file=sys.stderr, leave=False, unit="step",
                                 bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}]")

    def step(self, label: str) -> None:
        """Start the next phase."""
        if self._done:
            self._advance()
        self._done += 1
        self._label = label
        if self._log_phases:
            print(f"ckptfs bench: {time.perf_counter() - self._start:7.1f} s  {label}", file=sys.stderr)
        self._draw(label)

    @property
    def phase(self) -> str:
        return self._label

    def detail(self, text: str) -> None:
        self._draw(f"{self._label}: {text}")

    def _advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def _draw(self, text: str) -> None:
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.set_description_str(text[:60])
            return
        width = 30
        filled = width * (self._done - 1) // max(1, self._total)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self._done}/{self._total} {text[:60]:<60}")
        sys.stderr.flush()

    def close(self) -> None:
        if not self._enabled:
            return
        self._enabled = False
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


# -- the mount --------------------------------------------------------------------------------------------

class MountFailed(RuntimeError):
    """The CLI daemon did not mount (its one-line reason)."""


def _drop_page_cache(paths: tuple[str, ...]) -> None:
    """Evict the checkpoint's pages from the kernel page cache, so "cold" means read from the disk.

    posix_fadvise(DONTNEED) drops clean pages of a file for everyone; it needs no privileges. Best effort.
    """
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):
            pass
        finally:
            os.close(fd)


class BenchMount:
    """``ckptfs mount`` by the real CLI on a fresh directory; use through :func:`bench_mount`, which always
    unmounts and removes it."""

    def __init__(self, src: str, workdir: str, label: str, cache_size: int, env: dict[str, str] | None = None):
        self.path = os.path.join(workdir, label)
        self.log = os.path.join(workdir, label + ".log")
        self.pid: int | None = None
        self.ready_s = float("nan")
        self._command = [sys.executable, "-m", "ckptfs.cli", "mount", src, self.path, "--cache-size",
                         str(cache_size), "--log-file", self.log]
        self._env = {**os.environ, **(env or {})}
        os.mkdir(self.path)

    def start(self) -> None:
        """Run ``ckptfs mount`` (it returns once the mount is ready); MountFailed with its reason."""
        start = time.perf_counter()
        process = subprocess.Popen(self._command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=self._env)
        try:
            _, err = process.communicate(timeout=MOUNT_TIMEOUT)
        except BaseException:
            # Interrupted: let the CLI finish, so a mount it is making exists when close() looks for it.
            process.wait(timeout=MOUNT_TIMEOUT)
            raise
        self.ready_s = time.perf_counter() - start
        if process.returncode != 0:
            raise MountFailed((err.strip().splitlines() or [f"exit status {process.returncode}"])[-1])
        self.pid = int(self.stats()["pid"])

    def stats(self) -> dict[str, Any]:
        return json.loads(os.getxattr(self.path, STATS_XATTR))

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def close(self) -> None:
        """Unmount (the daemon then exits by itself) and remove the mountpoint; never raises."""
        from .fs.mountpoint import is_mount_point, unmount

        try:
            if is_mount_point(self.path):
                unmount(self.path)
        except Exception as exc:  # noqa: BLE001 - cleanup must go on; say what is left behind
            print(f"ckptfs bench: could not unmount {self.path}: {exc}", file=sys.stderr)
            return
        deadline = time.monotonic() + 5.0
        while self.pid is not None and procinfo.alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            os.rmdir(self.path)
        except OSError:
            pass


@contextmanager
def bench_mount(src: str, workdir: str, label: str, cache_size: int,
                env: dict[str, str] | None = None) -> Iterator[BenchMount]:
    mount = BenchMount(src, workdir, label, cache_size, env)
    try:
        mount.start()
        yield mount
    finally:
        mount.close()


# -- the daemon's memory ------------------------------------------------------------------------------------

class AnonMemorySampler:
    """Peak RssAnon of a process and its children, sampled every 10 ms in a background thread.

    Anonymous memory is what the daemon allocates (decoded blocks, Python objects); the checkpoint's own
    pages, read with pread, belong to the kernel page cache and are excluded by RssAnon by definition.
    """

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pids, refreshed = [self.pid], 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - refreshed > 0.5:
                pids, refreshed = [self.pid, *procinfo.children(self.pid)], now
            self.peak = max(self.peak, sum(procinfo.rss_anon(p) or 0 for p in pids))
            self._stop.wait(SAMPLE_INTERVAL)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


# -- workloads through the mount ------------------------------------------------------------------------------

def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def stat_open_read(path: str, offset: int) -> float:
    """What a tool pays for its first bytes of a file: stat, open, one 4 KiB read."""
    start = time.perf_counter()
    os.stat(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, PAGE, offset)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    if len(data) != PAGE:
        raise OSError(f"{path}: short read of {len(data)} bytes at {offset}")
    return elapsed


def random_reads(path: str, offsets: np.ndarray) -> np.ndarray:
    """Seconds per 4 KiB pread at each offset, on one open descriptor."""
    times = np.empty(len(offsets))
    fd = os.open(path, os.O_RDONLY)
    try:
        for i, offset in enumerate(offsets):
            start = time.perf_counter()
            data = os.pread(fd, PAGE, int(offset))
            times[i] = time.perf_counter() - start
            if len(data) != PAGE:
                raise OSError(f"{path}: short read at {offset}")
    finally:
        os.close(fd)
    return times


def mmap_rows(path: str, rows: np.ndarray) -> tuple[float, np.ndarray]:
    """``np.load(mmap_mode="r")`` time, then seconds per copied-out row (each a page-fault path)."""
    open_s, array = _timed(lambda: np.load(path, mmap_mode="r"))
    times = np.empty(len(rows))
    try:
        for i, row in enumerate(rows):
            start = time.perf_counter()
            np.array(array[int(row)])
            times[i] = time.perf_counter() - start
    finally:
        del array  # unmapped now, or the unmount would find the file busy
    return open_s, times


def scan(paths: list[str], progress: Progress) -> tuple[int, float]:
    """Read every file start to end with 1 MiB reads into one buffer (as ``cat`` does): bytes, seconds."""
    buffer = bytearray(SCAN_READ)
    view = memoryview(buffer)
    total = 0
    start = time.perf_counter()
    for i, path in enumerate(paths):
        try:
            with open(path, "rb", buffering=0) as f:
                while True:
                    n = f.readinto(view)
                    if not n:
                        break
                    total += n
        except OSError as exc:  # a read error carries no file name: add it, for the one-line report
            raise OSError(exc.errno, exc.strerror, path) from None
        if i % 16 == 0:
            progress.detail(f"{i + 1}/{len(paths)} files, {format_size(total)}")
    return total, time.perf_counter() - start


# -- the reference libraries ------------------------------------------------------------------------------------

@dataclass
class Reference:
    """The same workloads through gguf-py or safetensors, and whether their values equal the mount's."""

    library: str
    open_process_s: float | None = None
    open_in_process_s: float | None = None
    largest_s: float | None = None
    all_s: float = 0.0
    all_bytes: int = 0
    compared: int = 0
    mismatches: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def all_mbs(self) -> float | None:
        return self.all_bytes / self.all_s / 1e6 if self.all_s > 0 else None


def _time_process(code: str, plan: Plan) -> float:
    """Wall time of a fresh Python process running ``code`` on the checkpoint, page cache dropped first."""
    _drop_page_cache(plan.files)
    seconds, result = _timed(lambda: subprocess.run([sys.executable, "-c", code, plan.src], stdin=subprocess.DEVNULL,
                                                    capture_output=True, text=True))
    if result.returncode != 0:
        raise RuntimeError(f"reference process failed: {(result.stderr.strip().splitlines() or ['?'])[-1]}")
    return seconds


def equal_to_mount(values: np.ndarray, npy_path: str) -> bool:
    """Whether ``values`` equal the mount's .npy (read back through the mount), bit for bit where the dtypes
    match, else value for value (NaN-aware) after casting the mount's values to the reference dtype."""
    served = np.load(npy_path, mmap_mode="r")
    try:
        ours, theirs = served.reshape(-1), np.asarray(values).reshape(-1)
        if ours.shape != theirs.shape:
            return False
        step = 1 << 22
        for start in range(0, ours.size, step):
            a, b = np.array(ours[start:start + step]), np.asarray(theirs[start:start + step])
            if a.dtype == b.dtype:
                same = a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()
            else:
                same = np.array_equal(a.astype(b.dtype), b, equal_nan=b.dtype.kind in "fc")
            if not same:
                return False
        return True
    finally:
        del served  # unmaps now (no gc.collect: with a GGUFReader alive one takes 0.5 s)


def gguf_reference(plan: Plan, mount: BenchMount, progress: Progress) -> Reference | None:
    """gguf-py: ``GGUFReader`` (process and in-process), ``gguf.quants.dequantize`` per tensor."""
    try:
        import gguf
        from gguf.quants import dequantize
    except ImportError:
        return None
    ref = Reference(f"gguf-py {_version('gguf')}")
    progress.step("gguf-py: GGUFReader in a new process")
    ref.open_process_s = _time_process("import sys; from gguf import GGUFReader; GGUFReader(sys.argv[1])", plan)
    progress.step("gguf-py: GGUFReader in-process")
    ref.open_in_process_s, reader = _timed(lambda: gguf.GGUFReader(plan.src))
    tensors = {}
    for t in reader.tensors:
        tensors.setdefault(t.name, t)

    def decode(f: NpyFile) -> np.ndarray:
        t = tensors[f.tensor]
        return dequantize(t.data, t.tensor_type)

    _compare_all(ref, plan, mount, progress, decode, lambda f: f.tensor in tensors)
    return ref


def safetensors_reference(plan: Plan, mount: BenchMount, progress: Progress) -> Reference | None:
    """safetensors: ``safe_open(framework="np")`` and ``get_tensor``. Its numpy API has no bfloat16, so BF16
    tensors are read the way a numpy user must: the bytes at the header's offsets, widened to float32."""
    try:
        from safetensors import safe_open
    except ImportError:
        return None
    ref = Reference(f"safetensors {_version('safetensors')}")
    progress.step("safetensors: safe_open in a new process")
    ref.open_process_s = _time_process(
        "import sys; from safetensors import safe_open; f = safe_open(sys.argv[1], 'np'); list(f.keys())", plan)
    progress.step("safetensors: safe_open in-process")
    ref.open_in_process_s, handle = _timed(lambda: safe_open(plan.src, "np"))
    header, data_start = _safetensors_header(plan.src)
    with open(plan.src, "rb") as raw_file:
        def decode(f: NpyFile) -> np.ndarray:
            entry = header[f.tensor]
            if entry["dtype"] != "BF16":
                return handle.get_tensor(f.tensor)
            begin, end = entry["data_offsets"]
            raw_file.seek(data_start + begin)
            halves = np.frombuffer(raw_file.read(end - begin), "<u2")
            return (halves.astype("<u4") << 16).view("<f4").reshape(entry["shape"])

        supported = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"}
        _compare_all(ref, plan, mount, progress, decode,
                     lambda f: f.tensor in header and header[f.tensor]["dtype"] in supported)
    return ref


def _safetensors_header(path: str) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(length)), 8 + length


def _compare_all(ref: Reference, plan: Plan, mount: BenchMount, progress: Progress,
                 decode: Callable[[NpyFile], np.ndarray], supported: Callable[[NpyFile], bool]) -> None:
    """Decode the largest tensor alone (timed), then every tensor (timed, summed), each compared with the
    mount's .npy after its timing."""
    largest = plan.largest
    if largest is not None and supported(largest):
        progress.step(f"{ref.library}: decode the largest tensor")
        ref.largest_s, values = _timed(lambda: decode(largest))
        del values
    progress.step(f"{ref.library}: decode every tensor, compare with the mount")
    for i, f in enumerate(plan.npy):
        if not supported(f):
            ref.skipped.append(f.tensor)
            continue
        seconds, values = _timed(lambda: decode(f))
        ref.all_s += seconds
        ref.all_bytes += np.asarray(values).nbytes
        if not equal_to_mount(values, mount.file(f.file)):
            ref.mismatches.append(f.tensor)
        ref.compared += 1
        del values
        if i % 16 == 0:
            progress.detail(f"{i + 1}/{len(plan.npy)} tensors")


def _version(package: str) -> str:
    try:
        from importlib.metadata import version
        return version(package)
    except Exception:  # noqa: BLE001 - a version string is decoration
        return "?"


# -- the run ------------------------------------------------------------------------------------------------

def _machine() -> dict[str, Any]:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu": model, "cpus": os.cpu_count(), "load_average": list(os.getloadavg()),
            "kernel": platform.release(), "python": platform.python_version(), "numpy": np.__version__,
            "ckptfs": __version__}


def _percentile(times: np.ndarray, q: float) -> float:
    return float(np.percentile(times, q)) if len(times) else float("nan")


def _measure_mount(plan: Plan, workdir: str, cache_size: int, progress: Progress, with_reference: bool,
                   results: dict[str, Any]) -> Reference | None:
    """Everything on the first fresh daemon, the reference workloads while it is still mounted (their
    values are compared with the files it served), then the .npy scan again on a daemon without prefetch."""
    m: dict[str, Any] = results["mount"]
    reference = None
    progress.step("mount (cold page cache)")
    _drop_page_cache(plan.files)
    with bench_mount(plan.src, workdir, "mnt", cache_size) as mount:
        _mount_workloads(plan, mount, progress, m)
        if with_reference:
            try:
                reference = (gguf_reference if plan.format == "gguf" else safetensors_reference)(plan, mount,
                                                                                                 progress)
            except Exception as exc:  # noqa: BLE001 - a reference that cannot read the file is a finding
                results["reference_error"] = one_line(f"{type(exc).__name__}: {exc}")
    progress.step("scan every .npy with prefetch off (a fresh daemon)")
    with bench_mount(plan.src, workdir, "mnt-noprefetch", cache_size, env={"CKPTFS_PREFETCH": "0"}) as plain:
        sampler = AnonMemorySampler(plain.pid)
        try:
            m["npy_noprefetch_bytes"], m["npy_noprefetch_s"] = scan([plain.file(f.file) for f in plan.npy],
                                                                    progress)
        finally:
            m["daemon_peak_rss_anon_noprefetch"] = sampler.stop()
    return reference


def _mount_workloads(plan: Plan, mount: BenchMount, progress: Progress, m: dict[str, Any]) -> None:
    """The user-side workloads, in an order that keeps each one cold where it claims to be."""
    rng = np.random.default_rng(0)
    sampler = AnonMemorySampler(mount.pid)
    try:
        m["ready_s"] = mount.ready_s
        m["listdir_s"], names = _timed(lambda: os.listdir(mount.path))
        m["files"] = len(names)
        largest = plan.largest
        if largest is not None:
            progress.step("first 4 KiB read in the fresh daemon")
            misses_before = mount.stats()["cache"]["misses"]
            offset = _random_offsets(largest, 1, rng)[0]
            m["first_read_s"] = stat_open_read(mount.file(largest.file), int(offset))
            m["first_read_cache_misses"] = [misses_before, mount.stats()["cache"]["misses"]]
            m["largest"] = {"file": largest.file, "storage_type": largest.storage_type,
                            "shape": list(largest.shape), "nbytes": largest.nbytes}
        progress.step("metadata.json, ls -l")
        if "metadata.json" in names:
            m["metadata_json_first_s"], size = _timed(lambda: len(_read_file(mount.file("metadata.json"))))
            m["metadata_json_bytes"] = size
        m["stat_all_s"], _ = _timed(lambda: [os.stat(mount.file(n)) for n in names])
        if largest is not None:
            progress.step("random 4 KiB reads")
            times = random_reads(mount.file(largest.file), _random_offsets(largest, RANDOM_READS, rng))
            m["random_read_p50_s"], m["random_read_p99_s"] = _percentile(times, 50), _percentile(times, 99)
            m["random_reads"] = len(times)
        sample = plan.sample
        if sample is not None:
            progress.step("one tensor cold and warm")
            m["tensor"] = {"file": sample.file, "storage_type": sample.storage_type, "nbytes": sample.nbytes}
            m["tensor_cold_s"], _ = _timed(lambda: np.load(mount.file(sample.file)))
            m["tensor_warm_s"], _ = _timed(lambda: np.load(mount.file(sample.file)))
        if largest is not None and len(largest.shape) >= 2:
            progress.step("np.load(mmap_mode='r'), random rows")
            rows = rng.integers(0, largest.shape[0], RANDOM_ROWS)
            m["mmap_open_s"], times = mmap_rows(mount.file(largest.file), rows)
            m["mmap_row_p50_s"], m["mmap_row_p99_s"] = _percentile(times, 50), _percentile(times, 99)
        progress.step("scan every .npy")
        m["npy_bytes"], m["npy_s"] = scan([mount.file(f.file) for f in plan.npy], progress)
        progress.step("scan every .raw")
        m["raw_bytes"], m["raw_s"] = scan([mount.file(n) for n in plan.raw], progress)
        m["cache"] = mount.stats()["cache"]
    finally:
        m["daemon_peak_rss_anon"] = sampler.stop()


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _random_offsets(f: NpyFile, n: int, rng: np.random.Generator) -> np.ndarray:
    """Page-aligned offsets of 4 KiB reads inside the file (the data, past the header)."""
    first = -(-f.data_offset // PAGE)
    last = (f.data_offset + f.nbytes) // PAGE - 1
    return rng.integers(first, max(first, last) + 1, n) * PAGE


def _summarize(results: dict[str, Any], reference: Reference | None, cache_size: int) -> None:
    """Throughputs, ratios and targets from the raw figures (all in ``results``)."""
    m = results["mount"]
    m["npy_mbs"] = m["npy_bytes"] / m["npy_s"] / 1e6 if m.get("npy_s") else None
    m["raw_mbs"] = m["raw_bytes"] / m["raw_s"] / 1e6 if m.get("raw_s") else None
    m["npy_noprefetch_mbs"] = (m["npy_noprefetch_bytes"] / m["npy_noprefetch_s"] / 1e6
                               if m.get("npy_noprefetch_s") else None)
    ratios: dict[str, float | None] = {
        "npy_over_raw": _ratio(m["npy_mbs"], m["raw_mbs"]),
        "prefetch_gain": _ratio(m["npy_mbs"], m["npy_noprefetch_mbs"]),
    }
    limit = cache_size + RSS_SLACK
    targets = [{"name": "daemon peak RssAnon <= cache + 100 MiB", "value": m["daemon_peak_rss_anon"],
                "goal": limit, "met": m["daemon_peak_rss_anon"] <= limit}]
    if reference is not None:
        r = results["reference"] = {
            "library": reference.library, "open_process_s": reference.open_process_s,
            "open_in_process_s": reference.open_in_process_s, "largest_s": reference.largest_s,
            "all_s": reference.all_s, "all_bytes": reference.all_bytes, "all_mbs": reference.all_mbs,
            "compared": reference.compared, "mismatches": reference.mismatches, "skipped": reference.skipped,
            "bytes_equal": not reference.mismatches and reference.compared > 0}
        mount_list = m["ready_s"] + m["listdir_s"]
        ratios["open"] = _ratio(r["open_process_s"], mount_list)
        ratios["first_read"] = _ratio(r["largest_s"], m.get("first_read_s"))
        ratios["random_read_p50"] = _ratio(r["largest_s"], m.get("random_read_p50_s"))
        ratios["stream"] = _ratio(m["npy_mbs"], r["all_mbs"])
        if results["format"] == "gguf":
            for key, name, goal in (("open", "mount + os.listdir vs GGUFReader open (processes)", TARGETS["open"]),
                                    ("random_read_p50", "random 4 KiB read p50 vs dequantize largest",
                                     TARGETS["random_read"]),
                                    ("stream", ".npy stream vs gguf-py dequantization MB/s", TARGETS["stream"])):
                value = ratios[key]
                targets.append({"name": name, "value": value, "goal": goal,
                                "met": value is not None and value >= goal})
    else:
        results["reference"] = None
    results["ratios"] = ratios
    results["targets"] = targets


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# -- output -------------------------------------------------------------------------------------------------

def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def _times(r: float | None) -> str:
    return "-" if r is None else (f"{r:.0f}x" if r >= 10 else f"{r:.2f}x")


def _mbs(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} MB/s"


def render(results: dict[str, Any]) -> str:
    """The human table: one line per figure, the reference and the ratio beside it where there is one."""
    m, r, q = results["mount"], results.get("reference") or {}, results["ratios"]
    ref_name = r.get("library", "")
    rows: list[tuple[str, str, str, str]] = [
        ("mount ready + os.listdir (processes)", _seconds(m["ready_s"] + m["listdir_s"]),
         f"{_seconds(r.get('open_process_s'))} open" if r else "", _times(q.get("open"))),
        ("  mount ready (ckptfs mount returns)", _seconds(m["ready_s"]), "", ""),
        (f"  os.listdir ({m['files']} names)", _seconds(m["listdir_s"]), "", ""),
        ("  reference open in-process", "", _seconds(r.get("open_in_process_s")) if r else "", ""),
    ]
    if "metadata_json_first_s" in m:
        rows.append((f"metadata.json first read ({format_size(m['metadata_json_bytes'])})",
                     _seconds(m["metadata_json_first_s"]), "", ""))
    rows.append((f"ls -l (stat {m['files']} files)", _seconds(m["stat_all_s"]), "", ""))
    if "first_read_s" in m:
        largest = m["largest"]
        before, after = m["first_read_cache_misses"]
        rows += [
            (f"largest .npy: {largest['file']} ({largest['storage_type']}, {format_size(largest['nbytes'])})",
             "", f"{_seconds(r.get('largest_s'))} decode" if r else "", ""),
            (f"  first 4 KiB read, fresh daemon (misses {before}->{after})", _seconds(m["first_read_s"]), "",
             _times(q.get("first_read"))),
            (f"  random 4 KiB read p50 (n={m['random_reads']})", _seconds(m["random_read_p50_s"]), "",
             _times(q.get("random_read_p50"))),
            ("  random 4 KiB read p99", _seconds(m["random_read_p99_s"]), "", ""),
        ]
    if "tensor_cold_s" in m:
        t = m["tensor"]
        rows.append((f"np.load {t['file']} ({format_size(t['nbytes'])}) cold / warm",
                     f"{_seconds(m['tensor_cold_s'])} / {_seconds(m['tensor_warm_s'])}", "", ""))
    if "mmap_open_s" in m:
        rows += [("np.load(mmap_mode='r') of the largest", _seconds(m["mmap_open_s"]), "", ""),
                 ("  random row p50 / p99", f"{_seconds(m['mmap_row_p50_s'])} / {_seconds(m['mmap_row_p99_s'])}",
                  "", "")]
    rows += [
        (f".npy stream, 1 MiB reads ({format_size(m['npy_bytes'])})", _mbs(m["npy_mbs"]),
         f"{_mbs(r.get('all_mbs'))} decode" if r else "", _times(q.get("stream"))),
        ("  prefetch off (a fresh daemon)", _mbs(m["npy_noprefetch_mbs"]), "", ""),
        ("  prefetch gain", _times(q.get("prefetch_gain")), "", ""),
        ("  .npy stream / .raw stream", _times(q.get("npy_over_raw")), "", ""),
        (f".raw stream, 1 MiB reads ({format_size(m['raw_bytes'])})", _mbs(m["raw_mbs"]), "", ""),
        ("daemon peak RssAnon (+children)", format_size(m["daemon_peak_rss_anon"]), "", ""),
    ]
    width = max(len(row[0]) for row in rows)
    header = f"{'':<{width}}  {'ckptfs':>18}  {ref_name:>22}  {'ratio':>7}"
    lines = [_title(results), header, "-" * len(header)]
    lines += [f"{a:<{width}}  {b:>18}  {c:>22}  {d:>7}" for a, b, c, d in rows]
    if results.get("damaged"):
        lines.append(f"damaged tensors, left out of every read: {len(results['damaged'])}")
        lines += [one_line(f"  {d['name']!r}: {d['reason']}") for d in results["damaged"]]
    if results.get("reference_error"):
        lines.append(f"reference library could not read the checkpoint: {results['reference_error']}")
    if r:
        verdict = ("equal" if r["bytes_equal"] else f"DIFFERENT in {len(r['mismatches'])}: "
                   + ", ".join(r["mismatches"][:5]))
        skipped = f" ({len(r['skipped'])} not decodable by {ref_name})" if r["skipped"] else ""
        lines.append(f"values vs {ref_name}: {verdict} ({r['compared']} tensors){skipped}")
    lines.append("targets:")
    for t in results["targets"]:
        value = format_size(t["value"]) if "RssAnon" in t["name"] else _times(t["value"])
        goal = format_size(t["goal"]) if "RssAnon" in t["name"] else f">= {_times(t['goal'])}"
        lines.append(f"  {'met    ' if t['met'] else 'NOT MET'}  {t['name']}: {value} (goal {goal})")
    return "\n".join(lines)


def _title(results: dict[str, Any]) -> str:
    mc = results["machine"]
    load = "/".join(f"{x:.1f}" for x in mc["load_average"])
    return (f"ckptfs bench {results['checkpoint']} ({results['format']}, {results['tensors']} tensors, "
            f"{format_size(results['stored_bytes'])}), cache {format_size(results['cache_size'])}\n"
            f"{mc['cpus']} x {mc['cpu']}, load {load}, Linux {mc['kernel']}, Python {mc['python']}, "
            f"numpy {mc['numpy']}, ckptfs {mc['ckptfs']}\n")


def _remove_workdir(workdir: str) -> None:
    """Remove the logs and mountpoints; a directory still mounted (unmount failed) is left, and named."""
    for name in os.listdir(workdir):
        path = os.path.join(workdir, name)
        if os.path.ismount(path):
            print(f"ckptfs bench: {path} is still mounted; left in place", file=sys.stderr)
            return
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    os.rmdir(workdir)


# -- entry point ----------------------------------------------------------------------------------------------

@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the finally blocks unmount and clean up."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: no handler, no change
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class ReadFailed(OSError):
    """A read through the mount failed: which phase, file and tensor."""


def _read_failed(progress: Progress, plan: Plan, exc: OSError) -> ReadFailed:
    name = os.path.basename(exc.filename) if isinstance(exc.filename, str) else None
    tensor = plan.tensor_of.get(name) if name else None
    where = f"{name}" + (f" (tensor {tensor!r})" if tensor is not None else "") if name else "the mount"
    return ReadFailed(one_line(f"{progress.phase}: reading {where} failed: {exc.strerror or exc}"))


def run_bench(src: str, as_json: bool = False, cache_size: int = 512 << 20, verbose: bool = False) -> int:
    """Run every workload on ``src``; print the table (or JSON); the exit code: 0, or 1 when the mount
    failed or the reference library decoded different values."""
    with open_checkpoint(src) as ck:
        plan = make_plan(ck, src)
    with_reference = len(plan.files) == 1
    steps = 13 + (6 if with_reference else 0)
    progress = Progress(steps, enabled=sys.stderr.isatty() and not verbose, log_phases=verbose)
    results: dict[str, Any] = {"checkpoint": src, "format": plan.format, "files": len(plan.files),
                               "tensors": plan.tensors, "stored_bytes": plan.stored_bytes, "cache_size": cache_size,
                               "machine": _machine(), "mount": {},
                               "damaged": [{"name": name, "reason": reason} for name, reason in plan.damaged]}
    workdir = tempfile.mkdtemp(prefix="ckptfs-bench-")
    with _sigterm_as_interrupt():
        try:
            reference = _measure_mount(plan, workdir, cache_size, progress, with_reference, results)
        except KeyboardInterrupt:
            progress.close()
            print("ckptfs bench: interrupted (mounts cleaned up)", file=sys.stderr)
            return 130
        except MountFailed as exc:
            progress.close()
            print(f"ckptfs: error: mount failed: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:
            progress.close()
            print(f"ckptfs: error: {_read_failed(progress, plan, exc)}", file=sys.stderr)
            return 1
        finally:
            progress.close()
            _remove_workdir(workdir)
    results["machine"]["load_average_after"] = list(os.getloadavg())
    _summarize(results, reference, cache_size)
    print(json.dumps(results, indent=2) if as_json else render(results))
    if reference is not None and reference.mismatches:
        return 1
    return 0
