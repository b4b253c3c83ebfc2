"""A gpt-oss folder on ``s3://`` (moto's standalone S3 server on loopback, objects uploaded by boto3): the
experts' views are exact through the API (a small read included) and the stored blocks byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

import ckptfs  # noqa: E402
from fp4_fixtures import GPT_OSS_CONFIG, gptoss_experts, gptoss_formula  # noqa: E402
from packed_fixtures import same_bits, write_folder  # noqa: E402
from loopback.servers import MotoS3, environment  # noqa: E402

BUCKET = "fp4"
EXPERTS = "model.layers.0.mlp.experts"


def test_s3_gptoss_views(tmp_path):
    rng = np.random.default_rng(31)
    stored, expected = {}, {}
    for proj, out, in_features in (("gate_up_proj", 128, 64), ("down_proj", 64, 64)):
        parts = gptoss_experts(rng, 2, out, in_features)
        stored.update({f"{EXPERTS}.{proj}_{role}": value for role, value in parts.items()})
        expected[f"{EXPERTS}.{proj}"] = gptoss_formula(parts["blocks"], parts["scales"])
    folder = write_folder(tmp_path / "m", {}, GPT_OSS_CONFIG, extra_tensors=stored)
    with MotoS3() as server, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket=BUCKET)
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), BUCKET, f"m/{path.name}")
        with ckptfs.open(f"s3://{BUCKET}/m/", timeout=10, stall_timeout=2) as ck:
            for name, values in expected.items():
                view = ck[name]
                assert view.meta["scheme"] == "mxfp4" and view.shape == values.shape
                assert same_bits(view[1], values[1])
                assert same_bits(view.numpy(), values)
                assert ck[name + "_blocks"].raw() == stored[name + "_blocks"].tobytes()
