"""``ckptfs bench``: one run of every workload through fresh daemons, beside the references."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ckptfs import __version__
from ckptfs.checkpoint.api import open as open_checkpoint
from ckptfs.core.options import OpenOptions
from ckptfs.util.oneline import one_line
from ckptfs.bench.harness import (
    AnonMemorySampler,
    BenchMount,
    MountFailed,
    drop_page_cache,
    bench_mount,
)
from ckptfs.bench.plan import Plan, make_plan
from ckptfs.bench.progress import Progress
from ckptfs.bench.references import Reference, gguf_reference, safetensors_reference
from ckptfs.bench.report import _percentile, _summarize, group_streams, render
from ckptfs.bench.workloads import (
    _random_offsets,
    _read_file,
    _timed,
    mmap_rows,
    random_reads,
    scan,
    stat_open_read,
)

RANDOM_READS = 200


RANDOM_ROWS = 200


def machine() -> dict[str, Any]:
    """The machine a run measured on (CPU model and count, load, kernel, versions): every report's header,
    ``ckptfs bench``'s and the benchmark suite's alike."""
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu": model, "cpus": os.cpu_count(), "load_average": list(os.getloadavg()),
            "kernel": platform.release(), "python": platform.python_version(), "numpy": np.__version__,
            "ckptfs": __version__}


def _measure_mount(plan: Plan, workdir: str, options: OpenOptions, progress: Progress, with_reference: bool,
                   results: dict[str, Any]) -> Reference | None:
    """Everything on the first fresh daemon, the reference workloads while it is still mounted (their
    values are compared with the files it served), then the .npy scan again on a daemon without decode-ahead."""
    m: dict[str, Any] = results["mount"]
    reference = None
    progress.step("mount (cold page cache)")
    drop_page_cache(plan.files)
    with bench_mount(plan.src, workdir, "mnt", options) as mount:
        _mount_workloads(plan, mount, progress, m)
        if with_reference:
            try:
                reference = (gguf_reference if plan.format == "gguf" else safetensors_reference)(plan, mount,
                                                                                                 progress)
            except Exception as exc:  # noqa: BLE001 - a reference that cannot read the file is a finding
                results["reference_error"] = one_line(f"{type(exc).__name__}: {exc}")
    progress.step("scan every .npy with decode-ahead off (a fresh daemon)")
    with bench_mount(plan.src, workdir, "mnt-no-decode-ahead", options, env={"CKPTFS_DECODE_AHEAD": "0"}) as plain:
        sampler = AnonMemorySampler(plain.pid)
        try:
            m["npy_no_decode_ahead_bytes"], m["npy_no_decode_ahead_s"] = scan([plain.file(f.file) for f in plan.npy],
                                                                    progress)
        finally:
            m["daemon_peak_rss_anon_no_decode_ahead"] = sampler.stop()
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
        npy_files: list[tuple[int, float]] = []
        m["npy_bytes"], m["npy_s"] = scan([mount.file(f.file) for f in plan.npy], progress, npy_files)
        progress.step("scan every .raw")
        raw_files: list[tuple[int, float]] = []
        m["raw_bytes"], m["raw_s"] = scan([mount.file(n) for n in plan.raw], progress, raw_files)
        m["npy_files"] = dict(zip((f.file for f in plan.npy), npy_files))
        m["raw_files"] = dict(zip(plan.raw, raw_files))
        m["cache"] = mount.stats()["cache"]
    finally:
        m["daemon_peak_rss_anon"] = sampler.stop()


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


def run_bench(src: str, as_json: bool = False, options: OpenOptions | None = None, verbose: bool = False, *,
              cache_size: int | None = None) -> int:
    """Run every workload on ``src`` through mounts opened with ``options`` (``cache_size``: a change to
    them); print the table (or JSON); the exit code: 0, or 1 when the mount failed or the reference library
    decoded different values."""
    options = OpenOptions.build(options, cache_size=cache_size)
    cache_size = options.cache_size
    with open_checkpoint(src) as ck:
        plan = make_plan(ck, src)
    with_reference = len(plan.files) == 1
    steps = 13 + (6 if with_reference else 0)
    progress = Progress(steps, enabled=sys.stderr.isatty() and not verbose, log_phases=verbose)
    results: dict[str, Any] = {"checkpoint": src, "format": plan.format, "files": len(plan.files),
                               "tensors": plan.tensors, "stored_bytes": plan.stored_bytes, "cache_size": cache_size,
                               "machine": machine(), "mount": {},
                               "damaged": [{"name": name, "reason": reason} for name, reason in plan.damaged]}
    workdir = tempfile.mkdtemp(prefix="ckptfs-bench-")
    with _sigterm_as_interrupt():
        try:
            reference = _measure_mount(plan, workdir, options, progress, with_reference, results)
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
    m = results["mount"]
    m["groups"] = group_streams(plan.group_of, m.pop("npy_files", {}), m.pop("raw_files", {}),
                                reference.decoded_of if reference is not None else None)
    _summarize(results, reference, cache_size)
    print(json.dumps(results, indent=2) if as_json else render(results))
    if reference is not None and reference.mismatches:
        return 1
    return 0
