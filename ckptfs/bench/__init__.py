"""``ckptfs bench CKPT``: what reading a checkpoint through a ckptfs mount costs, beside what users do today.

The checkpoint is mounted by the real CLI (``python -m ckptfs.commands.cli mount``, a daemon) on a temporary
mountpoint that is always unmounted and removed, also on Ctrl-C or SIGTERM. Measured through the mount,
from this process, the way a user's tools read it: mount-to-ready and ``os.listdir`` (whole processes, as a
user waits for them), the first access to ``metadata.json``, an ``ls -l``-like stat of every file, the very
first 4 KiB read of the largest ``.npy`` in the fresh daemon (stat + open + read, with the daemon's cache-miss
counter before and after to show it was cold), random 4 KiB reads in it (p50, p99), ``np.load`` of one
tensor cold and warm, ``np.load(mmap_mode="r")`` with random rows, and sequential scans of every ``.npy``
and every ``.raw`` with 1 MiB reads (``cat``; ``.raw`` is the mount's transport ceiling), while sampling the
daemon's anonymous memory (RssAnon of it and its children; file-backed pages of the checkpoint are the
kernel's page cache and do not count). A second fresh daemon with ``CKPTFS_DECODE_AHEAD=0`` repeats the ``.npy``
scan, so the decode-ahead gain is measured in the same run.

Where gguf-py or safetensors is installed (``pip install 'ckptfs[bench]'``; imported here lazily, never by
the rest of the package), the same workloads run through it: opening the file as a whole process, decoding
the largest tensor, and decoding every tensor in-process — whose values are compared with what the mount
served in the same run, so a fast wrong answer fails the bench (exit 1). Figures are single measurements on
whatever machine this is; the ratios between them, taken minutes apart, are the meaningful numbers.

A damaged checkpoint is benched on what is intact: damaged tensors (``ckptfs info`` lists them) are left out
of every read and listed with their reason; a reference library that cannot read the damaged file is
reported, not fatal; and a read that fails anyway names the phase, the file and the tensor.

The package: ``plan`` (what to read, from the mount tree), ``harness`` (the mount and its memory),
``workloads`` (the reads), ``references`` (gguf-py / safetensors beside it), ``report`` (the table), ``run``
(one whole run). Scripts use the names exported here.
"""

from __future__ import annotations

from ckptfs.bench.harness import AnonMemorySampler, BenchMount, MountFailed, bench_mount
from ckptfs.bench.plan import NpyFile, Plan, make_plan
from ckptfs.bench.progress import Progress
from ckptfs.bench.report import TARGETS, render
from ckptfs.bench.run import run_bench
from ckptfs.bench.workloads import mmap_rows, random_reads, scan, stat_open_read

__all__ = ["AnonMemorySampler", "BenchMount", "MountFailed", "NpyFile", "Plan", "Progress", "TARGETS",
           "bench_mount", "make_plan", "mmap_rows", "random_reads", "render", "run_bench", "scan",
           "stat_open_read"]
