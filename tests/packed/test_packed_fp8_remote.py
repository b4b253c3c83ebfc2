"""An FP8 folder on ``s3://`` (moto's standalone S3 server on loopback, objects uploaded by boto3) and on
``hf://`` (the Hub stand-in): the views are exact through the API and through a mount, the stored codes and
scales byte for byte, the config and shards served as uploaded."""

from __future__ import annotations

import os

import numpy as np
import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

import ckptfs  # noqa: E402
from fp8_fixtures import BF16, block_quantize, expected_blocks, write_model  # noqa: E402
from mount_expect import npy_bytes  # noqa: E402
from packed_fixtures import same_bits  # noqa: E402
from loopback.servers import MotoS3, environment  # noqa: E402

BUCKET = "fp8"
Q = "model.layers.0.mlp.down_proj"
K = "model.layers.0.self_attn.kv_a_proj_with_mqa"


@pytest.fixture(scope="module")
def s3_fp8(tmp_path_factory):
    rng = np.random.default_rng(30)
    q_codes, q_scales = block_quantize(rng, (300, 260), (128, 128), BF16)
    k_codes, k_scales = block_quantize(rng, (200, 130), (128, 128), np.float32)
    folder = write_model(tmp_path_factory.mktemp("fp8") / "m",
                         {Q + ".weight": q_codes, Q + ".weight_scale_inv": q_scales,
                          K + ".weight": k_codes, K + ".weight_scale_inv": k_scales},
                         {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
                         shards=2)
    expected = {Q: (q_codes, expected_blocks(q_codes, q_scales, (128, 128))),
                K: (k_codes, expected_blocks(k_codes, k_scales, (128, 128)))}
    with MotoS3() as server, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket=BUCKET)
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), BUCKET, f"m/{path.name}")
        yield folder, expected


def test_s3_fp8_views_through_the_api(s3_fp8):
    folder, expected = s3_fp8
    with ckptfs.open(f"s3://{BUCKET}/m/", timeout=10, stall_timeout=2) as ck:
        for prefix, (codes, values) in expected.items():
            view = ck[prefix + ".weight"]
            assert view.virtual and view.meta["scheme"] == "fp8"
            assert same_bits(view.numpy(), values)
            assert same_bits(view[7:9], values[7:9])
            assert ck.stored(prefix + ".weight").raw() == codes.tobytes()


def test_s3_fp8_mount(s3_fp8, mounted):
    folder, expected = s3_fp8
    mnt = mounted(f"s3://{BUCKET}/m/", "--timeout", "10", "--stall-timeout", "2")
    for prefix, (codes, values) in expected.items():
        assert (mnt / (prefix + ".weight.npy")).read_bytes() == npy_bytes(values)
        assert (mnt / (prefix + ".weight.raw")).read_bytes() == codes.tobytes()
    for path in folder.iterdir():
        assert (mnt / path.name).read_bytes() == path.read_bytes()
    assert len([n for n in os.listdir(mnt) if n.endswith(".weight.npy")]) == 2


def test_hf_fp8_views(tmp_path):
    """The same kind of folder as an ``hf://`` repository (the Hub stand-in on loopback, its LFS files on
    nginx): the views are exact, the codes' bytes as stored."""
    pytest.importorskip("huggingface_hub")
    from hub_origin import hub_origin

    rng = np.random.default_rng(31)
    codes, scales = block_quantize(rng, (150, 300), (128, 128), BF16)

    def fill(repo):
        write_model(repo, {Q + ".weight": codes, Q + ".weight_scale_inv": scales},
                    {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"})

    with hub_origin(tmp_path, "org/fp8", fill):
        with ckptfs.open("hf://org/fp8", timeout=30) as ck:
            view = ck[Q + ".weight"]
            assert view.virtual and same_bits(view.numpy(), expected_blocks(codes, scales, (128, 128)))
            assert ck.stored(Q + ".weight").raw() == codes.tobytes()
