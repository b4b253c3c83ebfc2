"""The ByteSource contract (ckptfs/sources/base.py), one set of tests run over every kind of source.

Kinds: a local file (``FileSource``), http (Debian's nginx on loopback), s3 (moto's S3 server, objects
uploaded with boto3), hf (the Hub stand-in redirecting LFS files to an nginx CDN), mirror (a
``MirrorSource`` over a local primary and a local copy), checked (``ManifestCheck.wrap`` over a
``FileSource``, the manifest built by ``build_manifest``) and in-memory (tests/memsource.py). Each kind serves
the same two GGUF files of about 3 MiB (so ranges cross the remote sources' 256 KiB chunks and reach past
the 2 MiB first read kept at open); the oracle is the file's bytes read by plain Python.

Servers are module-scoped and started only when a test of their kind runs. What differs between kinds is
stated per kind (``Kind``), not loosened: where the contract lets a source choose (what a read after
``close`` and a change of the file gives), each kind's choice is asserted.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import memsource
import numpy as np
import pytest
from fixtures import write_gguf
from loopback.servers import HubStandIn, MotoS3, Nginx, environment
from conftest import require_nginx

import ckptfs
from ckptfs.sources.remote.store.chunks import CHUNK
from ckptfs.core.errors import CheckpointError
from ckptfs.formats.multi import read_checkpoint
from ckptfs.integrity.checked import ManifestCheck
from ckptfs.integrity.manifest import build_manifest
from ckptfs.sources.base import ByteSource
from ckptfs.sources.local import FileSource
from ckptfs.sources.mirror import MirrorSource
from ckptfs.sources.registry import Opener

FILES = ("model.gguf", "other.gguf")
TIMEOUT = 10.0
HANG_GUARD_S = 60.0
TOKEN = "hf_contract_token"


def write_model(path: Path, seed: int) -> bytes:
    """A GGUF of two float32 tensors (about 3.2 MiB), its bytes. Equal seeds give equal files."""
    rng = np.random.default_rng(seed)
    write_gguf(path, {f"t{i}": (rng.standard_normal(420_000).astype(np.float32), "F32") for i in range(2)})
    return path.read_bytes()


@dataclass
class Kind:
    """How one kind of source is opened, where its files' bytes are, and what it does after a change.

    ``open(name)``: a fresh source of the file ``name``. ``publish(name, data)``: make ``name`` hold ``data``
    (a new file, or the file rewritten; for a mirror only the primary is rewritten). ``after_change``: what a
    read of bytes not yet read gives after ``close`` and a rewrite of the file: ``"error"`` (the source
    refuses another version) or ``"old"`` (it serves the bytes as they were at open: a copy in memory, a
    mirror's identical copy, a content-addressed CDN object). ``mtime``: ``"exact"`` (the file's
    st_mtime_ns), ``"seconds"`` (HTTP's Last-Modified, whole seconds) or ``"any"`` (an int >= 0).
    """

    name: str
    open: Callable[[str], ByteSource]
    publish: Callable[[str, bytes], None]
    after_change: str
    mtime: str
    folder: Path  # where the published bytes also lie as plain files (the oracle's copy)


def local_folder(base: Path, data: dict[str, bytes]) -> Path:
    for name, blob in data.items():
        (base / name).write_bytes(blob)
    return base


@pytest.fixture(scope="module")
def blobs(tmp_path_factory) -> dict[str, bytes]:
    base = tmp_path_factory.mktemp("blobs")
    return {name: write_model(base / name, seed) for seed, name in enumerate(FILES)}


def _write(folder: Path, name: str, data: bytes) -> None:
    path = folder / name
    tmp = path.with_name(f".{name}.new")
    tmp.write_bytes(data)
    if path.exists():  # a rewrite: another mtime even on a coarse clock
        st = path.stat()
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def local_kind(blobs, tmp_path_factory) -> Kind:
    folder = local_folder(tmp_path_factory.mktemp("local"), blobs)
    return Kind("local", lambda name: FileSource(str(folder / name)), lambda n, d: _write(folder, n, d),
                "error", "exact", folder)


@pytest.fixture(scope="module")
def http_kind(blobs, tmp_path_factory):
    require_nginx()
    from ckptfs.sources.remote.http import HttpSource
    from ckptfs.core.options import OpenOptions
    from ckptfs.sources.remote.options import RemoteOptions

    folder = local_folder(tmp_path_factory.mktemp("www"), blobs)
    with Nginx(folder) as server:
        # a fresh RemoteOptions per open: no probe memoized from an earlier open of the URL
        yield Kind("http", lambda name: HttpSource(f"{server.url}/{name}",
                                                   options=RemoteOptions(OpenOptions.build(timeout=TIMEOUT, stall_timeout=2))),
                   lambda n, d: _write(folder, n, d), "error", "seconds", folder)


def _remote(url: str) -> ByteSource:
    """``url`` opened through the scheme registry with fresh remote options."""
    from ckptfs.core.options import OpenOptions
    from ckptfs.sources.remote.options import RemoteOptions

    return Opener(RemoteOptions(OpenOptions.build(timeout=TIMEOUT, stall_timeout=2))).source(url)


@pytest.fixture(scope="module")
def s3_kind(blobs, tmp_path_factory):
    boto3 = pytest.importorskip("boto3")
    folder = local_folder(tmp_path_factory.mktemp("s3"), blobs)
    with MotoS3() as server, environment(server.env()):
        client = boto3.client("s3", endpoint_url=server.endpoint)
        client.create_bucket(Bucket="contract")

        def publish(name: str, data: bytes) -> None:
            _write(folder, name, data)
            client.put_object(Bucket="contract", Key=f"m/{name}", Body=data)

        for name, data in blobs.items():
            publish(name, data)
        yield Kind("s3", lambda name: _remote(f"s3://contract/m/{name}"), publish, "error", "any", folder)


@pytest.fixture(scope="module")
def hf_kind(blobs, tmp_path_factory):
    require_nginx()
    pytest.importorskip("urllib3")
    base = tmp_path_factory.mktemp("hub")
    repo, cdn = base / "repo", base / "cdn"
    for d in (repo, cdn):
        d.mkdir()
    local_folder(repo, blobs)
    with Nginx(cdn) as cdn_server:
        stand_in = HubStandIn({"org/contract": repo}, cdn, cdn_server.url, token=TOKEN)

        def publish(name: str, data: bytes) -> None:
            _write(repo, name, data)
            stand_in._add("org/contract", name, repo / name)  # the CDN object is named by the new sha256

        with stand_in, environment({"HF_ENDPOINT": stand_in.url, "HF_TOKEN": TOKEN}):
            yield Kind("hf", lambda name: _remote(f"hf://org/contract/{name}"), publish, "old", "any", repo)


@pytest.fixture(scope="module")
def mirror_kind(blobs, tmp_path_factory) -> Kind:
    primary = local_folder(tmp_path_factory.mktemp("primary"), blobs)
    copy = local_folder(tmp_path_factory.mktemp("mirror"), blobs)

    def publish(name: str, data: bytes) -> None:
        if not (primary / name).exists():  # a new file: the same bytes in both
            _write(copy, name, data)
        _write(primary, name, data)

    def opened(name: str) -> ByteSource:
        return MirrorSource(FileSource(str(primary / name)), [FileSource(str(copy / name))], TIMEOUT)

    # a rewritten primary fails its reads (FileSource); the mirror still holds the bytes as at open
    return Kind("mirror", opened, publish, "old", "exact", primary)


@pytest.fixture(scope="module")
def checked_kind(blobs, tmp_path_factory) -> Kind:
    folder = local_folder(tmp_path_factory.mktemp("checked"), blobs)

    def opened(name: str) -> ByteSource:
        path = str(folder / name)
        parsed = read_checkpoint(path)
        with ckptfs.open(path) as ck:
            manifest = build_manifest(ck)
        return ManifestCheck(manifest, parsed).wrap(FileSource(path))

    return Kind("checked", opened, lambda n, d: _write(folder, n, d), "error", "exact", folder)


@pytest.fixture(scope="module")
def memory_kind(blobs, tmp_path_factory):
    folder = local_folder(tmp_path_factory.mktemp("mem"), blobs)
    keys = []

    def publish(name: str, data: bytes) -> None:
        _write(folder, name, data)
        memsource.STORE[f"contract/{name}"] = data
        keys.append(f"contract/{name}")

    for name, data in blobs.items():
        publish(name, data)
    yield Kind("memory", lambda name: memsource.MemSource(f"mem://contract/{name}"), publish, "old", "any", folder)
    for key in keys:
        memsource.STORE.pop(key, None)


KINDS = ("local", "http", "s3", "hf", "mirror", "checked", "memory")


@pytest.fixture(params=KINDS)
def kind(request) -> Kind:
    return request.getfixturevalue(f"{request.param}_kind")


@pytest.fixture
def source(kind):
    src = kind.open("model.gguf")
    yield src
    src.close()


def oracle(kind: Kind, name: str = "model.gguf") -> bytes:
    with open(kind.folder / name, "rb") as f:
        return f.read()


def ranges(size: int, seed: int, n: int = 40) -> list[tuple[int, int]]:
    """Random ranges plus the edges: 0-length, the first and last byte, spans of chunk boundaries."""
    rng = random.Random(seed)
    picks = [(0, 0), (size // 2, 0), (size, 0), (0, 1), (size - 1, 1), (0, size), (CHUNK - 1, 2),
             (CHUNK - 10, CHUNK + 20), (3 * CHUNK - 5, 5), (3 * CHUNK, 5), (size - CHUNK - 3, CHUNK + 3)]
    for _ in range(n):
        offset = rng.randrange(size)
        picks.append((offset, rng.randrange(0, min(size - offset, 3 * CHUNK) + 1)))
    return picks


def test_name_size_identity_mtime_are_present_and_stable(kind, source):
    blob = oracle(kind)
    before = (source.name, source.size, source.identity, source.mtime_ns)
    assert isinstance(source.name, str) and source.name
    assert source.size == len(blob)
    assert isinstance(source.identity, tuple) and source.identity
    assert isinstance(source.mtime_ns, int) and source.mtime_ns >= 0
    st = os.stat(kind.folder / "model.gguf")
    if kind.mtime == "exact":
        assert source.mtime_ns == st.st_mtime_ns
    elif kind.mtime == "seconds":
        assert source.mtime_ns == int(st.st_mtime) * 10**9
    source.pread(0, 100)
    source.pread(source.size - 100, 100)
    assert (source.name, source.size, source.identity, source.mtime_ns) == before
    again = kind.open("model.gguf")
    try:
        assert (again.name, again.size, again.identity, again.mtime_ns) == before
    finally:
        again.close()


def test_pread_returns_exactly_the_bytes_asked_for(kind, source):
    blob = oracle(kind)
    for offset, size in ranges(len(blob), seed=1):
        got = source.pread(offset, size)
        assert bytes(got) == blob[offset:offset + size], (offset, size)


@pytest.mark.parametrize("offset, size", [(-1, 10), ("end-1", 2), ("end", 1), ("end+10", 1), (0, "all+1")])
def test_a_range_past_the_end_raises_never_a_short_read(kind, source, offset, size):
    end = source.size
    offset = {"end-1": end - 1, "end": end, "end+10": end + 10}.get(offset, offset)
    size = end + 1 if size == "all+1" else size
    with pytest.raises(CheckpointError):
        source.pread(offset, size)
    with pytest.raises(CheckpointError):
        source.pread_into(offset, memoryview(bytearray(size)))
    assert bytes(source.pread(0, 16)) == oracle(kind)[:16]  # the source still serves


def test_pread_into_equals_pread(kind, source):
    for offset, size in ranges(source.size, seed=2, n=15):
        into = bytearray(size)
        source.pread_into(offset, into)
        assert bytes(into) == bytes(source.pread(offset, size)), (offset, size)
        wide = bytearray(b"\xaa" * (size + 16))  # a view into a larger buffer: only its window is written
        source.pread_into(offset, memoryview(wide)[8:8 + size])
        assert wide[8:8 + size] == into and wide[:8] == b"\xaa" * 8 and wide[8 + size:] == b"\xaa" * 8


def test_content_id_is_stable_across_opens_and_names_the_content(kind, source):
    first = source.content_id()
    assert isinstance(first, str) and first
    assert source.content_id() == first
    again, other = kind.open("model.gguf"), kind.open("other.gguf")
    try:
        assert again.content_id() == first
        assert other.content_id() != first
    finally:
        again.close()
        other.close()


def test_advise_never_raises(kind, source):
    for offset, size in [(0, 1), (0, source.size), (CHUNK, 2 * CHUNK), (0, 0), (source.size, 10),
                         (source.size - 1, 100), (-5, 10), (10 * source.size, 1)]:
        assert source.advise(offset, size) is None
        assert source.advise(offset, size, sequential=True) is None
    source.close()
    assert source.advise(0, CHUNK) is None
    blob = oracle(kind)
    assert bytes(source.pread(CHUNK, CHUNK)) == blob[CHUNK:2 * CHUNK]  # advice changed no byte


def test_stats_is_a_dict(source):
    assert isinstance(source.stats(), dict)
    source.pread(0, 10)
    assert isinstance(source.stats(), dict)


def test_a_read_after_close_reopens_the_same_file(kind, source):
    blob = oracle(kind)
    assert bytes(source.pread(0, 64)) == blob[:64]
    source.close()
    source.close()  # twice is fine
    assert bytes(source.pread(len(blob) - CHUNK - 7, CHUNK)) == blob[len(blob) - CHUNK - 7:len(blob) - 7]
    source.ensure_open()
    assert bytes(source.pread(100, 200)) == blob[100:300]


def test_a_read_after_close_and_a_rewrite_is_old_bytes_or_an_error(kind, blobs, tmp_path):
    name = f"changing-{tmp_path.name}.gguf"
    kind.publish(name, blobs["model.gguf"])
    src = kind.open(name)
    try:
        old = oracle(kind, name)
        assert bytes(src.pread(0, 64)) == old[:64]
        src.close()
        new = write_model(tmp_path / "new.gguf", seed=7)
        assert len(new) == len(old) and new[-CHUNK:] != old[-CHUNK:]
        kind.publish(name, new)
        tail = len(old) - CHUNK  # past the first read any remote source kept at open: fetched now
        if kind.after_change == "error":
            with pytest.raises(CheckpointError):
                src.pread(tail, CHUNK)
        else:
            assert bytes(src.pread(tail, CHUNK)) == old[tail:]
    finally:
        src.close()


def test_concurrent_preads_from_8_threads_are_exact(kind, source):
    blob = oracle(kind)

    def worker(seed: int) -> list[tuple[int, int]]:
        wrong = []
        for offset, size in ranges(len(blob), seed=100 + seed, n=25):
            if bytes(source.pread(offset, size)) != blob[offset:offset + size]:
                wrong.append((offset, size))
        return wrong

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(worker, i) for i in range(8)]
        results = [f.result(timeout=HANG_GUARD_S) for f in futures]
    assert results == [[]] * 8
