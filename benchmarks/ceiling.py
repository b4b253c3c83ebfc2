"""The mount's ceiling: the ``.raw`` stream of the largest tensor beside a zero-work Python FUSE filesystem.

The zero-work filesystem serves one file of the same size through the same binding (ckptfs's own choice:
mfusepy on libfuse 3) with libfuse's default options; its ``read`` returns a preallocated buffer, so all it
costs is libfuse's and the binding's per-request work. Streamed side by side in one run, fresh mounts every
time, the configurations in rotating order over ``--rounds`` rounds (drifting background load spreads over
all of them), each with 1 MiB ``pread`` calls (``cat``'s pattern; the page cache of a fresh mount is empty):

  zero-work              libfuse defaults: the figure's reference
  zero-work+ra1M         the same with the kernel readahead ckptfs sets for its mounts (1 MiB, fuse/kernel.py):
                         what a do-nothing daemon moves with ckptfs's request sizes
  pread+ra1M             a minimal filesystem serving the tensor's real bytes with one ``os.pread`` per request
                         (1 MiB readahead): the least a Python daemon that copies the bytes can cost
  splice+ra1M            the same bytes handed to libfuse as a file descriptor (``read_buf``) with
                         FUSE_CAP_SPLICE_WRITE: no copy in user space at all (what "fewer copies" can gain)
  ckptfs                 NAME.raw of the largest tensor through ``ckptfs mount`` (the real CLI daemon): its
                         reads answered in C without the GIL (fuse/direct.py)
  ckptfs-c-off           the same with CKPTFS_C_READS=0: every read through mfusepy's Python callback
  ckptfs-ra-default      the C path with CKPTFS_READAHEAD_KB=0 (the kernel's readahead left as it is)
  ckptfs-ra4M            the C path with CKPTFS_READAHEAD_KB=4096 (requests stay 1 MiB: libfuse 3.14's cap)

After each stream the same file is read again with 1 MiB O_DIRECT reads, one at a time, each timed (the
same READ request size everywhere: the fastest tenth show the per-request cost with the least of the
machine's other load in them). Each figure comes with the daemon's CPU seconds per GiB, its peak RssAnon
(during the stream), and the sizes of the READ requests the daemon
answered, seen by the kernel's ``fuse:fuse_request_end`` tracepoint (a private ftrace instance filtered by
the mount's connection; root and tracefs needed, else the sizes are left out). The target: ckptfs >= 2x
zero-work in every round.

Usage: python -m benchmarks ceiling [CKPT.gguf] [--rounds 5] [--json OUT]
       (without CKPT: the Gemma 3 270M skeleton in scripts/real-shapes/, full size, generated once)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import SKELETONS, child_env, workload
from ckptfs.bench import bench_mount, make_plan
from ckptfs.bench.harness import AnonMemorySampler
from ckptfs.checkpoint.api import open as open_checkpoint
from ckptfs.core.options import OpenOptions

DEFAULT_SKELETON = SKELETONS / "gemma3-270m-q4_k_m.json"
CHUNK = 1 << 20
DEFAULT_CKPT = "/tmp/ckptfs-bench/gemma3-270m-shaped.gguf"
CONFIGS = ("zero-work", "zero-work+ra1M", "pread+ra1M", "splice+ra1M", "ckptfs", "ckptfs-c-off", "ckptfs-ra-default",
           "ckptfs-ra4M")
#: the environment of each ckptfs configuration's daemon
CKPTFS_ENV = {"ckptfs": {}, "ckptfs-c-off": {"CKPTFS_C_READS": "0"}, "ckptfs-ra-default": {"CKPTFS_READAHEAD_KB": "0"},
              "ckptfs-ra4M": {"CKPTFS_READAHEAD_KB": "4096"}}
CACHE_SIZE = 512 << 20
TRACEFS = "/sys/kernel/tracing"
FUSE_READ, OUT_HEADER = 15, 16
MOUNT_WAIT = 20.0


# ------------------------------------------------------------------------------------------ zero-work FUSE


class ZeroWork:
    """One file ``/data`` of ``size`` bytes; ``read`` hands back a buffer made once per request size.

    With ``source`` (path, offset), the file is those bytes of a real file instead: ``mode`` "pread" reads
    them per request, "splice" hands libfuse the descriptor (see :class:`SpliceFUSE`)."""

    def __init__(self, size: int, readahead_kib: int, mountpoint: str, mode: str = "zero",
                 source: tuple[str, int] | None = None):
        self.size, self.readahead_kib, self.mountpoint, self.mode = size, readahead_kib, mountpoint, mode
        self.buffers: dict[int, bytes] = {}
        self.fd, self.base = (os.open(source[0], os.O_RDONLY), source[1]) if source else (-1, 0)
        if mode == "splice":
            self.read_buf = True  # mfusepy registers libfuse's read_buf (SpliceFUSE serves it)
        now = time.time_ns()
        self.dir = {"st_mode": 0o40555, "st_nlink": 2, "st_mtime": now, "st_atime": now, "st_ctime": now}
        self.file = {"st_mode": 0o100444, "st_nlink": 1, "st_size": size, "st_mtime": now, "st_atime": now,
                     "st_ctime": now}

    use_ns = True

    def init_with_config(self, conn, config) -> None:  # mfusepy's ctypes structures
        if self.readahead_kib:  # what ckptfs does for its mounts (fuse/kernel.py), nothing more
            from ckptfs.fuse.kernel import set_mount_readahead

            if set_mount_readahead(self.mountpoint, self.readahead_kib) and conn is not None:
                conn.max_readahead = max(int(conn.max_readahead), self.readahead_kib * 1024)
        if self.mode == "splice" and conn is not None:
            conn.want |= conn.capable & (FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE)

    def getattr(self, path: str, fh: int | None = None) -> dict:
        if path == "/":
            return self.dir
        if path == "/data":
            return self.file
        raise OSError(2, "no such file")

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", "data"]

    def open(self, path: str, flags: int) -> int:
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        n = max(0, min(size, self.size - offset))
        if self.mode == "pread":
            return os.pread(self.fd, n, self.base + offset)
        buffer = self.buffers.get(n)
        if buffer is None:
            buffer = self.buffers[n] = bytes(n)
        return buffer


FUSE_CAP_SPLICE_WRITE, FUSE_CAP_SPLICE_MOVE = 1 << 7, 1 << 8
FUSE_BUF_IS_FD, FUSE_BUF_FD_SEEK = 1 << 1, 1 << 2


def splice_fuse_class(base: type) -> type:
    """``base`` (mfusepy's FUSE class) answering ``read_buf`` with a descriptor buffer: libfuse splices the
    bytes from the file into /dev/fuse (or, without splice, preads them itself, in C)."""
    import ctypes

    import mfusepy

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]

    class Buf(ctypes.Structure):  # struct fuse_buf
        _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                    ("fd", ctypes.c_int), ("pos", ctypes.c_int64)]

    class BufVec(ctypes.Structure):  # struct fuse_bufvec with its one inline buffer (libfuse frees it)
        _fields_ = [("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t),
                    ("buf", Buf * 1)]

    class SpliceFUSE(base):
        def read_buf(self, path, bufpp, size, offset, fip):  # ctypes arguments
            ops = self.operations
            address = libc.malloc(ctypes.sizeof(BufVec))
            if not address:
                return -12  # ENOMEM
            vec = BufVec.from_address(address)
            vec.count, vec.idx, vec.off = 1, 0, 0
            buf = vec.buf[0]
            buf.size, buf.flags, buf.mem = max(0, min(size, ops.size - offset)), FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK, None
            buf.fd, buf.pos = ops.fd, ops.base + offset
            bufpp[0] = ctypes.cast(address, mfusepy.fuse_bufvec_p)
            return 0

    return SpliceFUSE


def serve_zero_work(mountpoint: str, size: int, readahead_kib: int, mode: str, source: str, offset: int) -> None:
    """Run the zero-work (or pread / splice) filesystem in the foreground (this process) until unmounted."""
    from ckptfs.fuse.binding import load_binding

    load_binding("mfusepy")  # mfusepy pointed at libfuse 3, as ckptfs's daemon has it
    import mfusepy

    fuse_class = mfusepy.FUSE  # without ckptfs's read and listing paths: libfuse's and mfusepy's own
    if mode == "splice":
        fuse_class = splice_fuse_class(fuse_class)
    ops = ZeroWork(size, readahead_kib, mountpoint, mode, (source, offset) if mode != "zero" else None)
    fuse_class(ops, mountpoint, foreground=True, nothreads=False)


class ZeroWorkMount:
    """The zero-work filesystem in a child process (a daemon of its own, as ckptfs's is)."""

    def __init__(self, workdir: str, size: int, readahead_kib: int, mode: str = "zero",
                 source: tuple[str, int] = ("", 0)):
        self.path = tempfile.mkdtemp(dir=workdir)
        self.process = subprocess.Popen(workload("ceiling", "--serve", self.path, str(size), str(readahead_kib),
                                                 mode, source[0], str(source[1])),
                                        stdin=subprocess.DEVNULL, env=child_env())
        deadline = time.monotonic() + MOUNT_WAIT
        while not os.path.ismount(self.path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the zero-work filesystem did not mount")
            time.sleep(0.02)
        self.pid = self.process.pid

    def file(self) -> str:
        return os.path.join(self.path, "data")

    def close(self) -> None:
        subprocess.run(["fusermount3", "-u", self.path], check=False)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.rmdir(self.path)


# ------------------------------------------------------------------------------------------ request sizes


class RequestSizes:
    """READ reply sizes of one FUSE connection, from the ``fuse`` tracepoints in a private ftrace instance."""

    _line = re.compile(r"fuse_request_(send|end): connection (\d+) req (\d+) (?:opcode (\d+).*?)?len (\d+)")

    def __init__(self, name: str):
        self.instance = None
        if not os.path.isdir(os.path.join(TRACEFS, "events", "fuse")):
            subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], capture_output=True, check=False)
        try:
            self.instance = os.path.join(TRACEFS, "instances", name)
            os.mkdir(self.instance)
            self._write("buffer_size_kb", "8192")
        except OSError:
            self.instance = None

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.instance, name), "w") as f:
            f.write(value)

    def start(self, mountpoint: str) -> None:
        if self.instance is None:
            return
        dev = os.stat(mountpoint).st_dev
        self.connection = (os.major(dev) << 20) | os.minor(dev)  # the kernel's dev_t encoding
        self._write("trace", "")
        self._write("events/fuse/filter", f"connection == {self.connection}")
        self._write("events/fuse/enable", "1")

    def stop(self) -> collections.Counter | None:
        """Reply bytes of each READ request (the header left out) since ``start``: size -> count."""
        if self.instance is None:
            return None
        self._write("events/fuse/enable", "0")
        opcodes, sizes = {}, collections.Counter()
        with open(os.path.join(self.instance, "trace")) as f:
            for line in f:
                found = self._line.search(line)
                if not found:
                    continue
                event, _, req, opcode, length = found.groups()
                if event == "send":
                    opcodes[req] = int(opcode)
                elif opcodes.pop(req, None) == FUSE_READ:
                    sizes[int(length) - OUT_HEADER] += 1
        return sizes

    def close(self) -> None:
        if self.instance is not None:
            self._write("events/fuse/enable", "0")
            os.rmdir(self.instance)


def describe_sizes(sizes: collections.Counter | None) -> dict | None:
    if not sizes:
        return None
    n = sum(sizes.values())
    common = sizes.most_common(1)[0][0]
    return {"requests": n, "most_common_kib": common / 1024, "mean_kib": sum(k * v for k, v in sizes.items()) / n
            / 1024, "largest_kib": max(sizes) / 1024}


# ------------------------------------------------------------------------------------------ the run


def read_all(path: Path, direct: bool) -> float:
    """Seconds to read the whole file in 1 MiB reads."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        start = time.perf_counter()
        offset = 0
        while True:
            chunk = os.pread(fd, CHUNK, offset)
            if not chunk:
                break
            offset += len(chunk)
        return time.perf_counter() - start
    finally:
        os.close(fd)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ensure_fixture(src: str) -> None:
    """The default checkpoint (the Gemma 3 270M skeleton, full size), generated when missing."""
    if not os.path.exists(src):
        import make_realistic_gguf

        make_realistic_gguf.write_skeleton(src, str(DEFAULT_SKELETON))


def largest_raw(src: str) -> tuple[str, int, int]:
    """The mount file name of the largest tensor's stored bytes, its size and its offset in ``src``."""
    with open_checkpoint(src) as ck:
        plan = make_plan(ck, src)
        largest = max(ck.tensors, key=lambda t: t.info.stored_nbytes)
        name = next(f for f, t in plan.tensor_of.items() if t == largest.name and f.endswith(".raw"))
        return name, int(largest.info.stored_nbytes), int(largest.info.offset)


def direct_requests(path: str) -> dict:
    """1 MiB O_DIRECT reads of the whole file, one at a time, each timed: every read is one READ request of
    the same size for every configuration, so the fastest ones (p10) show the per-request cost with the
    least of the machine's other load in them."""
    times = []
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        offset = 0
        while True:
            start = time.perf_counter()
            n = len(os.pread(fd, CHUNK, offset))
            if not n:
                break
            times.append(time.perf_counter() - start)
            offset += n
    finally:
        os.close(fd)
    times.sort()
    return {"p10_mbs": CHUNK / times[len(times) // 10] / 1e6, "p50_mbs": CHUNK / times[len(times) // 2] / 1e6}


def stream(path: str, pid: int, trace: RequestSizes, mountpoint: str) -> dict:
    trace.start(mountpoint)
    sampler = AnonMemorySampler(pid)  # every configuration sampled alike (it costs the reader a little)
    cpu = cpu_seconds(pid)
    try:
        seconds = read_all(Path(path), direct=False)
    finally:
        cpu = cpu_seconds(pid) - cpu
        peak = sampler.stop()
    size = os.path.getsize(path)
    requests = describe_sizes(trace.stop())
    load = os.getloadavg()[0]
    result = {"mbs": size / seconds / 1e6, "seconds": seconds, "daemon_cpu_s_per_gib": cpu * (1 << 30) / size,
              "requests": requests, "load": load, "rss_anon_mib": peak / (1 << 20)}
    try:  # a ckptfs mount: how many of the stream's requests were answered in C
        result["c_reads"] = json.loads(os.getxattr(mountpoint, "user.ckptfs.stats"))["c_reads"]["reads"]
    except (OSError, KeyError, ValueError):
        pass
    return {**result, **direct_requests(path)}


def measure(config: str, src: str, raw: tuple[str, int, int], workdir: str, trace: RequestSizes) -> dict:
    raw_name, size, offset = raw
    if not config.startswith("ckptfs"):
        mode = config.split("+")[0].replace("zero-work", "zero")
        mount = ZeroWorkMount(workdir, size, 1024 if config.endswith("ra1M") else 0, mode, (src, offset))
        try:
            return stream(mount.file(), mount.pid, trace, mount.path)
        finally:
            mount.close()
    with bench_mount(src, workdir, f"mnt-{config}-{time.monotonic_ns()}", OpenOptions(cache_size=CACHE_SIZE),
                     env=CKPTFS_ENV[config]) as mount:
        return stream(mount.file(raw_name), mount.pid, trace, mount.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", nargs="?", help=f"a GGUF (default: {DEFAULT_CKPT}, generated from "
                                                f"{DEFAULT_SKELETON.name})")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--serve", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        mountpoint, size, readahead_kib, mode, source, offset = args.serve
        serve_zero_work(mountpoint, int(size), int(readahead_kib), mode, source, int(offset))
        return 0
    src = args.ckpt or DEFAULT_CKPT
    ensure_fixture(src)
    raw = raw_name, size, _ = largest_raw(src)
    read_all(Path(src), direct=False)  # the checkpoint in the page cache: measure FUSE, not the disk
    configs = args.configs.split(",")
    print(f"{src}: {raw_name}, {size / 1e6:.0f} MB; {args.rounds} rounds of {', '.join(configs)}; "
          f"load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    trace = RequestSizes(f"ckptfs-ceiling-{os.getpid()}")
    try:
        with tempfile.TemporaryDirectory(prefix="ckptfs-ceiling-") as workdir:
            for r in range(args.rounds):
                for config in configs[r % len(configs):] + configs[:r % len(configs)]:
                    result = measure(config, src, raw, workdir, trace)
                    runs[config].append(result)
                    req = result["requests"]
                    print(f"round {r + 1} {config:18s} {result['mbs']:6.0f} MB/s  daemon CPU "
                          f"{result['daemon_cpu_s_per_gib']:.2f} s/GiB  "
                          + (f"{req['requests']} READs, mostly {req['most_common_kib']:.0f} KiB" if req else "")
                          + f"  RssAnon {result['rss_anon_mib']:.0f} MiB"
                          + (f", {result['c_reads']} C reads" if "c_reads" in result else "")
                          + f"  load {result['load']:.2f}", file=sys.stderr, flush=True)
    finally:
        trace.close()
    summary = {"checkpoint": src, "file": raw_name, "bytes": size, "rounds": args.rounds, "cpus": os.cpu_count(),
               "runs": runs}
    for config, rs in runs.items():
        mbs = [x["mbs"] for x in rs]
        summary[config] = {"best_mbs": max(mbs), "median_mbs": statistics.median(mbs),
                           "direct_p10_mbs": statistics.median(x["p10_mbs"] for x in rs),
                           "direct_p50_mbs": statistics.median(x["p50_mbs"] for x in rs),
                           "median_cpu_s_per_gib": statistics.median(x["daemon_cpu_s_per_gib"] for x in rs)}
    for ours in ("ckptfs", "ckptfs-c-off", "ckptfs-ra-default", "ckptfs-ra4M", "splice+ra1M"):
        for base in ("zero-work", "zero-work+ra1M"):
            if ours in runs and base in runs:
                per_round = [a["mbs"] / b["mbs"] for a, b in zip(runs[ours], runs[base])]
                summary[f"{ours}_over_{base}"] = {"per_round": per_round, "min": min(per_round),
                                                  "median": statistics.median(per_round)}
    print(f"\n{'config':18s} {'best MB/s':>9s} {'median':>7s} {'CPU s/GiB':>9s} {'O_DIRECT p10/p50 MB/s':>22s}")
    for config in configs:
        s = summary[config]
        print(f"{config:18s} {s['best_mbs']:9.0f} {s['median_mbs']:7.0f} {s['median_cpu_s_per_gib']:9.2f} "
              f"{s['direct_p10_mbs']:11.0f} / {s['direct_p50_mbs']:.0f}")
    for key, value in summary.items():
        if "_over_" in key:
            print(f"{key}: per round {' '.join(f'{x:.2f}' for x in value['per_round'])}, min {value['min']:.2f}, "
                  f"median {value['median']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0
