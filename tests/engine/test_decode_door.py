"""The one decode door (``ckptfs.engine.decode``): the torch kernels and the packed tiles are backends
registered there by their own modules, and their decodes go through it.

- importing the engine registers nothing; importing a backend's module registers it (a fresh process);
- a packed view's tiles decode through the "packed" parts backend (a counting stand-in registered in its
  place sees every tile, and the values are the layout's own, bit for bit);
- the torch device path decodes through the "torch" device backend, which takes little-endian blocks of a
  type it has a kernel for, and nothing else;
- a parts backend nobody registered is a LookupError naming it.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from packed_fixtures import gptq_layer, same_bits, write_folder

import ckptfs
from ckptfs.core.descriptors import TensorInfo
from ckptfs.engine import decode
from ckptfs.quant import codec_for

PREFIX = "model.layers.0.self_attn.q_proj"
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True}


def test_backends_register_when_their_modules_are_imported():
    code = ("import ckptfs, ckptfs.engine.decode as d\n"
            "print(sorted(d._device), sorted(d._parts))\n"
            "import ckptfs.packed.views\n"
            "print(sorted(d._parts))\n")
    if "torch" in _importable():
        code += "import ckptfs.torchio.kernels\nprint(sorted(d._device))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[] []" and out[1] == "['packed']"
    if "torch" in _importable():
        assert out[2] == "['torch']"


def _importable() -> set[str]:
    try:
        import torch  # noqa: F401
    except ImportError:
        return set()
    return {"torch"}


class Counting:
    """A backend standing in for another at the door, counting what goes through."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    def decode_rows(self, layout, parts, o0, o1, out, backend):
        self.calls += 1
        return self.inner.decode_rows(layout, parts, o0, o1, out, backend)

    def has_kernel(self, storage_type):
        return self.inner.has_kernel(storage_type)

    def dequantize(self, storage_type, blocks):
        self.calls += 1
        return self.inner.dequantize(storage_type, blocks)


@pytest.fixture
def stand_in(monkeypatch):
    """Replace a registered backend by a counting one (the registry restored afterwards)."""

    def install(kind: str, name: str) -> Counting:
        registry = decode._parts if kind == "parts" else decode._device
        monkeypatch.setitem(registry, name, Counting(registry[name]))
        return registry[name]

    return install


def test_packed_tiles_decode_through_the_door(tmp_path, stand_in):
    layer = gptq_layer(np.random.default_rng(11), 96, 128, 4, 32, zero_range=(0, 16))
    folder = write_folder(tmp_path / "m", {PREFIX: layer.tensors}, GPTQ)
    with ckptfs.open(folder) as ck:
        view = ck[PREFIX + ".weight"]
        counting = stand_in("parts", "packed")
        got = view.numpy()
        tiles = counting.calls
        sliced = view[5:9]
    assert tiles >= 1 and counting.calls > tiles
    assert same_bits(got, layer.expected()) and same_bits(sliced, layer.expected()[5:9])


def test_an_unregistered_parts_backend_is_a_lookup_error():
    with pytest.raises(LookupError, match="'nothing-here'"):
        decode.decode_parts("nothing-here", None, None, 0, 1)


def test_the_torch_backend_takes_little_endian_blocks_it_has_a_kernel_for(tmp_path, stand_in):
    pytest.importorskip("torch")
    from fixtures import quantized, write_gguf

    from ckptfs.torchio import api

    q8 = codec_for("Q8_0")
    little = TensorInfo("t", "Q8_0", (32,), "f", 0, 34, block_elements=32, block_bytes=34)
    big = TensorInfo("t", "Q8_0", (32,), "f", 0, 34, block_elements=32, block_bytes=34, byte_order=">")
    assert decode.device_backend("torch", q8, little) is not None
    assert decode.device_backend("torch", q8, big) is None
    assert decode.device_backend("torch", None, little) is None
    assert decode.device_backend("no-such-device", q8, little) is None

    rng = np.random.default_rng(3)
    path = write_gguf(tmp_path / "q.gguf", {"w": (quantized("Q8_0", (64, 256), rng), "Q8_0")}).path
    counting = stand_in("device", "torch")
    on_device = api.load(path, ["w"], use_kernels=True)["w"]
    assert counting.calls >= 1
    with ckptfs.open(path) as ck:
        assert same_bits(on_device.numpy(), ck["w"].numpy())
