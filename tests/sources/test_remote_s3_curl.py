"""s3:// range GETs through libcurl (``ckptfs.sources.remote.s3_curl``), signed by libcurl with AWS Signature V4,
against moto's standalone S3 server with its IAM checks on: moto recomputes every request's signature with the
secret of the key it names (botocore's signer on moto's side) and checks a session's token, so a request
libcurl signed wrongly, or sent without the token, is refused. The users, the role and the objects are made
through boto3 before the checks are turned on (moto's ``/moto-api/reset-auth``); every read is compared with
the object's bytes as uploaded, and libcurl's own counters say which client carried it."""

from __future__ import annotations

import datetime
import json
import random
import sys
import urllib.request

import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

from loopback.servers import MotoS3, environment  # noqa: E402

from ckptfs.sources.remote.store import chunks  # noqa: E402
from ckptfs.sources.remote.store.chunks import CHUNK  # noqa: E402
from ckptfs.core.errors import CheckpointError  # noqa: E402
from ckptfs.core.options import OpenOptions  # noqa: E402
from ckptfs.core.runtime import runtime  # noqa: E402
from ckptfs.sources.netstats import SOURCE_COUNTERS  # noqa: E402
from ckptfs.sources.remote import curl  # noqa: E402
from ckptfs.sources.remote.context import ReadContext  # noqa: E402
from ckptfs.sources.remote.options import RemoteOptions  # noqa: E402
from ckptfs.sources.remote.s3 import S3Source  # noqa: E402

MiB = 1 << 20
BUCKET, KEY = "signed", "dir/a blob+1.bin"  # a key that needs encoding in the signed path
SIZE = 21 * MiB + 4321
ALLOW_ALL = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})
TRUST_ALL = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"},
                                                                "Action": "sts:AssumeRole"}]})


@pytest.fixture(autouse=True)
def native(libcurl):
    """Every test here runs with libcurl carrying the range GETs (``conftest.libcurl``)."""


@pytest.fixture(scope="module")
def moto():
    """(the server, the object's bytes, an admin's boto3 keys, a reader's keys); moto's IAM checks on."""
    data = random.Random(11).randbytes(SIZE)
    with MotoS3() as server, environment(server.env()):
        s3 = boto3.client("s3", endpoint_url=server.endpoint)
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key=KEY, Body=data)
        iam = boto3.client("iam", endpoint_url=server.endpoint)
        keys = {}
        for user in ("admin", "reader"):
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=ALLOW_ALL)
            key = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        iam.create_role(RoleName="reading", AssumeRolePolicyDocument=TRUST_ALL)
        iam.put_role_policy(RoleName="reading", PolicyName="all", PolicyDocument=ALLOW_ALL)
        urllib.request.urlopen(urllib.request.Request(f"{server.endpoint}/moto-api/reset-auth", data=b"0",
                                                      headers={"Content-Type": "text/plain"}), timeout=30).read()
        with pytest.raises(Exception, match="InvalidAccessKeyId"):  # the checks are on: a key moto does not know
            s3.get_object(Bucket=BUCKET, Key=KEY, Range="bytes=0-0")
        yield server, data, keys


def _admin(moto, service: str):
    server, _, keys = moto
    return boto3.client(service, endpoint_url=server.endpoint, aws_access_key_id=keys["admin"]["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=keys["admin"]["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")


def _open() -> S3Source:
    runtime().get(chunks.MEMORY_CHUNKS).clear()  # this process's chunk memory emptied: every read asks the origin
    return S3Source(f"s3://{BUCKET}/{KEY}", RemoteOptions(OpenOptions.build(timeout=20.0, stall_timeout=5.0)))


def _in(seconds: float) -> ReadContext:
    return ReadContext.entering(seconds)


def test_signed_range_reads_go_through_libcurl_with_the_objects_bytes(moto, monkeypatch):
    _, data, keys = moto
    with environment(keys["reader"]):
        src = _open()
        rng = random.Random(5)
        spans = [(0, SIZE), (SIZE - 1, SIZE), (CHUNK - 1, CHUNK + 1)]
        spans += [(a, min(SIZE, a + rng.randrange(1, 9 * MiB))) for a in (rng.randrange(SIZE) for _ in range(25))]
        before = curl.counters()
        for start, end in spans:
            parts = src.range.fetch(start, end, _in(20))  # the range client: chunk-sized parts, the last shorter
            assert b"".join(parts) == data[start:end], (start, end)
            assert all(len(p) == CHUNK for p in parts[:-1])
        for start, end in spans[3:12]:
            assert src.pread(start, end - start) == data[start:end], (start, end)
        transfers, body = (a - b for a, b in zip(curl.counters(), before))
        assert src.range.target and transfers >= len(spans) and body >= sum(e - s for s, e in spans)

        monkeypatch.setenv(curl.ENV, "0")  # the escape hatch: boto3 carries them, libcurl none
        plain = _open()
        before = curl.counters()
        assert plain.range.fetch(5, 5 * MiB, _in(20)) == data[5:5 * MiB]
        assert plain.pread(7 * MiB, 3 * MiB) == data[7 * MiB:10 * MiB]
        assert curl.counters() == before and plain.range.target is False


def test_a_sessions_token_is_signed_and_sent(moto):
    """Credentials of an assumed role: moto refuses a request without its token (or signed without it)."""
    _, data, _ = moto
    role = _admin(moto, "sts").assume_role(RoleArn="arn:aws:iam::123456789012:role/reading",
                                           RoleSessionName="ckptfs")["Credentials"]
    session = {"AWS_ACCESS_KEY_ID": role["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": role["SecretAccessKey"],
               "AWS_SESSION_TOKEN": role["SessionToken"]}
    with environment(session):
        src = _open()
        before = curl.counters()
        assert b"".join(src.range.fetch(3 * MiB, 11 * MiB, _in(20))) == data[3 * MiB:11 * MiB]
        assert src.pread(SIZE - 5 * MiB, 5 * MiB) == data[SIZE - 5 * MiB:]
        assert curl.counters()[0] > before[0]


@pytest.mark.parametrize("curl_env", ["1", "0"])
def test_a_key_withdrawn_after_open_fails_the_read_with_the_same_line_either_way(moto, monkeypatch, curl_env):
    """The reader's key deleted once the object is open: the next read fails with boto3's one line (the S3
    error code, the credentials named, never the secret), whichever client carries the range GETs."""
    monkeypatch.setenv(curl.ENV, curl_env)
    iam = _admin(moto, "iam")
    user = f"leaving{curl_env}"
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=ALLOW_ALL)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    with environment({"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}):
        src = _open()
        iam.delete_access_key(UserName=user, AccessKeyId=key["AccessKeyId"])
        before = curl.counters()
        with pytest.raises(CheckpointError) as info:
            src.pread(9 * MiB, 1000)
    assert str(info.value) == (f"s3://{BUCKET}/{KEY} @ byte {9 * MiB}: access denied (S3 InvalidAccessKeyId; sent AWS "
                               f"credentials from env (access key {key['AccessKeyId'][:4]}…))")
    assert key["SecretAccessKey"] not in str(info.value)
    assert (curl.counters()[0] > before[0]) == (curl_env == "1")


def test_credentials_refreshed_by_botocore_sign_the_next_request(moto, monkeypatch, tmp_path):
    """Credentials from a ``credential_process`` that expire soon (botocore refreshes them when frozen): the
    key is rotated between two reads, the old one deleted, and the second read is signed with the new key."""
    iam = _admin(moto, "iam")
    iam.create_user(UserName="rotating")
    iam.put_user_policy(UserName="rotating", PolicyName="all", PolicyDocument=ALLOW_ALL)
    current = tmp_path / "current.json"

    def issue() -> str:
        key = iam.create_access_key(UserName="rotating")["AccessKey"]
        expires = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=2)).isoformat()
        current.write_text(json.dumps({"Version": 1, "AccessKeyId": key["AccessKeyId"],
                                       "SecretAccessKey": key["SecretAccessKey"], "Expiration": expires}))
        return key["AccessKeyId"]

    first = issue()
    config = tmp_path / "config"
    config.write_text(f"[default]\ncredential_process = {sys.executable} -c \"import sys; "
                      f"sys.stdout.write(open('{current}').read())\"\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    _, data, _ = moto
    src = _open()
    assert src.pread(2 * MiB, MiB) == data[2 * MiB:3 * MiB]
    issue()
    iam.delete_access_key(UserName="rotating", AccessKeyId=first)
    before, retries = curl.counters(), runtime().get(SOURCE_COUNTERS).snapshot()["retries"]
    assert src.pread(12 * MiB, MiB) == data[12 * MiB:13 * MiB]
    assert curl.counters()[0] > before[0]
    assert runtime().get(SOURCE_COUNTERS).snapshot()["retries"] == retries  # signed with the new key at once, not after a refusal
