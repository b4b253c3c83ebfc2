"""s3:// checkpoints against moto's standalone S3 server on loopback (path-style: an endpoint given by
address), configured only through the standard AWS environment. Objects are uploaded with boto3 itself;
values are compared with gguf-py's / safetensors' reading of the same local files."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

import ckptfs  # noqa: E402
from ckptfs.core.errors import CheckpointError  # noqa: E402
from ckptfs.core.runtime import runtime  # noqa: E402
from ckptfs.sources.netstats import SOURCE_COUNTERS  # noqa: E402
from ckptfs.sources.remote.context import ReadContext  # noqa: E402
from fixtures import write_mixed_gguf  # noqa: E402
from multifile_sets import MODEL_FILES, safetensors_tensors, write_model_files, write_safetensors_set  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from loopback.servers import MotoS3, environment  # noqa: E402

BUCKET = "models"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    root = tmp_path_factory.mktemp("s3src")
    written = write_mixed_gguf(root / "mixed.gguf")
    folder = root / "llama"
    write_safetensors_set(folder, safetensors_tensors(3, per_shard=2, seed=9))
    write_model_files(folder)
    with MotoS3() as server, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket=BUCKET)
        client.upload_file(str(root / "mixed.gguf"), BUCKET, "gguf/mixed.gguf")
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), BUCKET, f"llama/{path.name}")
        client.put_object(Bucket=BUCKET, Key="llama/sub/ignored.json", Body=b"{}")
        yield server, root, written


def test_s3_gguf_equals_the_written_file(s3):
    _, root, written = s3
    with ckptfs.open(f"s3://{BUCKET}/gguf/mixed.gguf", timeout=10, stall_timeout=2) as ck, \
            ckptfs.open(root / "mixed.gguf") as local:
        assert [t.name for t in ck.tensors] == list(written.tensors)
        for t in ck.tensors:
            assert t.raw() == written.tensors[t.name].raw
            if t.decodable:
                np.testing.assert_array_equal(np.asarray(t), np.asarray(local[t.name]))
        assert ck.tensors[0].meta["source"] == f"s3://{BUCKET}/gguf/mixed.gguf"
    assert runtime().get(SOURCE_COUNTERS).snapshot()["by_scheme"]["s3"]["bytes"] > 0


def test_s3_folder_serves_shards_index_and_files(s3):
    _, root, _ = s3
    with ckptfs.open(f"s3://{BUCKET}/llama/", timeout=10) as ck:
        want = {}
        for path in sorted((root / "llama").glob("*.safetensors")):
            want.update(load_file(str(path)))
        assert sorted(ck) == sorted(want)
        for name, values in want.items():
            np.testing.assert_array_equal(np.asarray(ck[name]), values)
        passed = set(ck.passthrough)
        assert set(MODEL_FILES) <= passed and "model.safetensors.index.json" in passed
        assert all(not name.startswith("sub") for name in passed)  # sub-folders are not listed


def test_s3_folder_without_trailing_slash(s3):
    with ckptfs.open(f"s3://{BUCKET}/llama", timeout=10) as ck:
        assert len(ck) == 3 * 2 + 1


def test_s3_missing_key_is_one_line(s3):
    with pytest.raises(CheckpointError, match=r"not found \(S3 NoSuchKey\)") as info:
        ckptfs.open(f"s3://{BUCKET}/gguf/none.gguf", timeout=10)
    assert "\n" not in str(info.value)


def test_s3_changed_object_fails_the_read(s3):
    """The identity is fixed at open: a read after the object was replaced is refused by the server itself
    (If-Match on the ETag), never bytes of the new version."""
    server, _, _ = s3
    from ckptfs.sources import open_source

    client = boto3.client("s3", endpoint_url=server.endpoint)
    old, new = os.urandom(3 << 20), os.urandom(3 << 20)
    client.put_object(Bucket=BUCKET, Key="blob.bin", Body=old)
    source = open_source(f"s3://{BUCKET}/blob.bin")
    assert source.pread(2 << 20, 1000) == old[2 << 20:(2 << 20) + 1000]
    client.put_object(Bucket=BUCKET, Key="blob.bin", Body=new)
    with pytest.raises(CheckpointError, match="changed since it was opened"):
        source.pread(source.size - 100, 100)  # not fetched before: a request with If-Match


def test_s3_error_names_the_credentials_but_never_the_secret(s3, monkeypatch):
    """moto accepts any key; a bucket policy denying everything gives the 403 a real bucket would."""
    server, _, _ = s3
    client = boto3.client("s3", endpoint_url=server.endpoint)
    client.create_bucket(Bucket="locked")
    client.put_object(Bucket="locked", Key="m.gguf", Body=b"GGUF" + bytes(100))
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Deny", "Principal": "*", "Action": "s3:*",
                                                      "Resource": ["arn:aws:s3:::locked", "arn:aws:s3:::locked/*"]}]}
    client.put_bucket_policy(Bucket="locked", Policy=json.dumps(policy))
    try:
        ckptfs.open("s3://locked/m.gguf", timeout=10)
    except CheckpointError as exc:
        message = str(exc)
        assert "access denied" in message and "AWS credentials from env" in message
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in message
        assert os.environ["AWS_ACCESS_KEY_ID"] not in message
    else:
        pytest.skip("this moto version does not enforce bucket policies")


def test_s3_folder_mount(s3, mounted):
    _, root, _ = s3
    mnt = mounted(f"s3://{BUCKET}/llama/", "--timeout", "10", "--stall-timeout", "2")
    names = set(os.listdir(mnt))
    assert set(MODEL_FILES) <= names and "model.safetensors.index.json" in names
    for path in sorted((root / "llama").glob("*.safetensors")):
        assert (mnt / path.name).read_bytes() == path.read_bytes()  # the shards pass through
        for name, values in load_file(str(path)).items():
            np.testing.assert_array_equal(np.load(mnt / f"{name}.npy"), values)


def test_s3_without_credentials_reads_unsigned_through_libcurl(s3, monkeypatch, tmp_path, libcurl):
    """No credentials anywhere (a public bucket): the open and the range GETs go unsigned, the latter through
    libcurl, with the object's bytes."""
    from ckptfs.sources.remote import curl
    from ckptfs.sources.remote.s3 import S3Source

    server, _, _ = s3
    data = os.urandom(5 << 20)
    boto3.client("s3", endpoint_url=server.endpoint).put_object(Bucket=BUCKET, Key="public/blob.bin", Body=data,
                                                                ACL="public-read")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    src = S3Source(f"s3://{BUCKET}/public/blob.bin")
    assert src.credentials == "no credentials (unsigned requests)"
    before = curl.counters()
    start, end = len(data) // 3, len(data) - 5
    assert b"".join(src.range.fetch(start, end, ReadContext.entering(20))) == data[start:end]
    assert curl.counters()[0] > before[0]
