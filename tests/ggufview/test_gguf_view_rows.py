"""A read of ``gguf/model.gguf`` reads only the stored rows it maps to: the q/k permutation interleaves
the two rotary halves within each head, so a few output rows of ``attn_q`` come from two short runs of
stored rows, and nothing else of the file is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from counting import Counting
from gguf_view_models import make_llama

from ckptfs.checkpoint.api import Checkpoint
from ckptfs.formats.multi import read_checkpoint

pytest.importorskip("transformers")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_llama(tmp_path_factory.mktemp("rows") / "tiny", dtype="float16", hidden=128, heads=4, kv_heads=2)


@pytest.mark.parametrize("outtype,row_bytes", [("f32", 512), ("q8_0", 136)])
def test_a_range_reads_only_its_rows(folder, outtype, row_bytes):
    from ckptfs.ggufview.view import VirtualGgufView

    calls: list[tuple[int, int]] = []
    ck = Checkpoint(read_checkpoint(str(folder)), str(folder), source_wrapper=lambda s: Counting(s, calls))
    view = VirtualGgufView(ck, outtype)
    whole = view.read(0, view.size)
    plan, start = view.tensor_at("blk.1.attn_q.weight")
    info = plan.info
    assert (plan.rows, plan.cols, plan.row_bytes) == (128, 128, row_bytes)  # q8_0: 4 blocks of 34 bytes a row
    # output rows 37..42 are rows 5..10 of head 1 (32 rows a head, 16 per rotary half); output row 2i + j of
    # a head is its stored row 16j + i, so (i, j) = (2, 1) .. (5, 0): stored rows 32 + 3..5 and 32 + 16 + 2..4
    calls.clear()
    first, last = start + 37 * row_bytes + 100, start + 42 * row_bytes + 30
    got = view.read(first, last - first)
    stored_row = info.stored_nbytes // 128
    assert sorted(calls) == [(info.offset + 35 * stored_row, 3 * stored_row),
                             (info.offset + 50 * stored_row, 3 * stored_row)]
    assert got == whole[first:last]
    if outtype == "f32":  # the permutation itself, against the stored tensor
        stored = ck["model.layers.1.self_attn.q_proj.weight"].numpy().astype(np.float32)
        out = np.frombuffer(whole[start:start + plan.nbytes], np.float32).reshape(128, 128)
        assert np.array_equal(out, stored.reshape(4, 2, 16, 128).swapaxes(1, 2).reshape(128, 128))
    # a read of header bytes only reads no stored bytes at all
    calls.clear()
    view.read(0, len(view.header))
    assert calls == []
    ck.close()
