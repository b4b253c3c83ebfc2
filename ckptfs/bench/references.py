"""The same workloads through gguf-py or safetensors (imported lazily), and their values compared with
what the mount served, so a fast wrong answer fails the bench."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckptfs.bench.harness import BenchMount, drop_page_cache
from ckptfs.bench.plan import NpyFile, Plan
from ckptfs.bench.progress import Progress
from ckptfs.bench.workloads import _timed


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
    decoded_of: dict[str, tuple[int, float]] = field(default_factory=dict)  # .npy file -> (bytes, seconds)

    @property
    def all_mbs(self) -> float | None:
        return self.all_bytes / self.all_s / 1e6 if self.all_s > 0 else None


def _time_process(code: str, plan: Plan) -> float:
    """Wall time of a fresh Python process running ``code`` on the checkpoint, page cache dropped first."""
    drop_page_cache(plan.files)
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
    tensors: dict[str, gguf.ReaderTensor] = {}
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
        ref.decoded_of[f.file] = (np.asarray(values).nbytes, seconds)
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
