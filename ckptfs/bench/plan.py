"""What a bench reads: the mount's .npy and .raw files and the tensors behind them, asked of the mount tree
(the same names the mount serves), before mounting."""

from __future__ import annotations

from dataclasses import dataclass, field

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.tree.mount_tree import TensorFiles

SAMPLE_TENSOR_MAX = 64 << 20


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
    # mount file name (.npy and .raw) -> (storage type, the tensor's decoded bytes): the per-group figures
    group_of: dict[str, tuple[str, int]] = field(default_factory=dict, compare=False)

    @property
    def largest(self) -> NpyFile | None:
        return max(self.npy, key=lambda f: f.nbytes, default=None)

    @property
    def sample(self) -> NpyFile | None:
        """The tensor for the cold/warm fetch: a layer-sized one, the largest .npy of at most 64 MiB."""
        fitting = [f for f in self.npy if f.nbytes <= SAMPLE_TENSOR_MAX and f is not self.largest]
        return max(fitting, key=lambda f: f.nbytes, default=self.largest)


def make_plan(ck: Checkpoint, src: str) -> Plan:
    """What the mount will serve, asked of the mount's own tree (``MountTree``'s tensor files: the same
    names, the same .npy/.raw choice). Damaged tensors are left out of the reads (their missing bytes fail by
    design) and listed."""
    files_of = TensorFiles(ck)
    npy, raw, damaged, tensor_of, group_of = [], [], [], {}, {}
    for index, stem in enumerate(files_of.stems):
        tensor = ck.tensors[index]
        kinds = files_of.kinds(index)
        tensor_of.update({stem + ".raw": tensor.name, stem + ".npy": tensor.name})
        size = tensor.nbytes if tensor.nbytes is not None else tensor.stored_nbytes
        group_of[stem + ".raw"] = group_of[stem + ".npy"] = (tensor.storage_type, int(size))
        if tensor.info.damaged:
            damaged.append((tensor.name, tensor.info.damaged))
            continue
        if "raw" in kinds:
            raw.append(stem + ".raw")
        if "npy" in kinds:
            if tensor.nbytes is None:  # a .npy is served only for a tensor with a dtype
                raise TypeError(f"{tensor.name}: a .npy without a dtype")
            npy.append(NpyFile(stem + ".npy", tensor.name, tensor.storage_type, tuple(tensor.shape),
                               int(tensor.nbytes), int(tensor.meta["npy_data_offset"])))
    files = tuple(ck.files)
    return Plan(src, ck.format, files, sum(ck.sources.get(f).size for f in files), len(ck.tensors),
                tuple(npy), tuple(raw), tuple(damaged), tensor_of, group_of)
