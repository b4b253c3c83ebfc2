"""Small checkpoints several feature modules read, as pytest fixtures (registered by conftest).

- ``small``: a GGUF (``fixtures.Written``) of a Q8_0 tensor ``q`` (64 x 256) and an F32 ``f`` (32 values),
  with ``general.name`` = "small".
- ``index_gguf``: (path, {name: reference values}) of 3-d Q8_0 and F32 tensors (``q3``, ``f3``: 3 x 4 x 64)
  and a 1-d Q4_0 one (``q1``), for indexing like numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from fixtures import write_gguf

RNG = np.random.default_rng(20240611)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    rng = np.random.default_rng(3)
    return write_gguf(tmp_path_factory.mktemp("small") / "small.gguf",
                      {"q": (rng.standard_normal((64, 256)).astype(np.float32), "Q8_0"),
                       "f": (np.arange(32, dtype=np.float32), "F32")}, {"general.name": "small"})


@pytest.fixture(scope="module")
def index_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("index") / "index.gguf"
    written = write_gguf(path, {"q3": (RNG.standard_normal((3, 4, 64)).astype(np.float32), "Q8_0"),
                                "f3": (RNG.standard_normal((3, 4, 64)).astype(np.float32), "F32"),
                                "q1": (RNG.standard_normal(64).astype(np.float32), "Q4_0")})
    return path, {name: ref.array for name, ref in written.tensors.items()}
