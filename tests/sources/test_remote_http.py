"""http:// checkpoints served by Debian's nginx on loopback: the library API and real FUSE mounts read them
lazily with range requests, and every value equals what gguf-py / safetensors read from the local file.

Request and byte counts come from nginx's own access log (what the server saw), not from ckptfs's counters.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("urllib3")

import ckptfs
from ckptfs.core.errors import CheckpointError
from conftest import REPO, mount_stats, require_nginx
from loopback.faultproxy import FaultProxy
from fixtures import big_vocab_gguf, write_gguf, write_mixed_gguf, quantized
from loopback.servers import Nginx, OPEN_HEAD, data_ranges, is_tail_check, requests_since

MiB = 1 << 20
_RANGE = re.compile(r'range="bytes=(\d+)-(\d+)"')






def tail_checks_since(server: Nginx, before: int) -> int:
    return sum(is_tail_check(server, line) for line in server.access_log()[before:])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    require_nginx()
    root = tmp_path_factory.mktemp("www")
    mixed = write_mixed_gguf(root / "mixed.gguf")
    big_vocab_gguf(root / "vocab.gguf")
    rng = np.random.default_rng(5)
    write_gguf(root / "big.gguf", {"big.q4k": (quantized("Q4_K", (4096, 4096), rng), "Q4_K"),
                                   "small.f32": (rng.standard_normal(100).astype(np.float32), "F32")})
    (root / "head.gguf").write_bytes((root / "big.gguf").read_bytes())  # read by one test only (no chunk in memory)
    with Nginx(root) as server:
        yield server, root, mixed


def _values(ck) -> dict[str, np.ndarray]:
    return {t.name: np.asarray(t) for t in ck.tensors if t.decodable}


def test_open_url_equals_local(site):
    server, root, written = site
    with ckptfs.open(server.url + "/mixed.gguf", timeout=5, stall_timeout=1) as remote, \
            ckptfs.open(root / "mixed.gguf") as local:
        assert [t.name for t in remote.tensors] == [t.name for t in local.tensors]
        for t in remote.tensors:
            assert t.raw() == written.tensors[t.name].raw  # the bytes gguf-py wrote
            if t.decodable:
                np.testing.assert_array_equal(np.asarray(t), np.asarray(local[t.name]))
        assert remote.tensors[0].meta["source"] == server.url + "/mixed.gguf"
        assert json.dumps(remote.metadata.get("general.architecture")) == json.dumps(
            local.metadata.get("general.architecture"))


def test_vocabulary_header_in_few_requests(site):
    """A 262,144-token vocabulary (a 6.2 MiB header) opens and lists in at most 4 range requests, fetching at
    most twice the header + 2 MiB."""
    server, root, _ = site
    from gguf import GGUFReader

    header_end = min(t.data_offset for t in GGUFReader(root / "vocab.gguf").tensors)
    before = len(server.access_log())
    with ckptfs.open(server.url + "/vocab.gguf") as ck:
        assert len(ck.metadata["tokenizer.ggml.tokens"]) == 262_144
        names = list(ck)
    assert names
    seen = requests_since(server, before, checks=False)
    assert 1 <= len(seen) <= 4, seen
    assert all(status == 206 for _, status, _ in requests_since(server, before))
    assert sum(n for _, _, n in seen) <= 2 * header_end + 2 * MiB
    assert tail_checks_since(server, before) <= len(seen)  # the version's sample at open, one after each fetch


def _open_source(server, name: str, cache_dir=None):
    """The source of ``name`` as a mount opens it (no read-ahead), with or without a --cache-dir."""
    from ckptfs.core.options import OpenOptions
    from ckptfs.sources.registry import Opener
    from ckptfs.sources.remote.options import RemoteOptions

    options = RemoteOptions(OpenOptions.build(timeout=10, cache_dir=cache_dir), read_ahead=False)
    return Opener(options).source(f"{server.url}/{name}")


def test_an_open_with_a_cache_dir_asks_for_the_first_4_kib_and_serves_them_from_memory(site, tmp_path):
    """With a --cache-dir the open asks for the file's first bytes only (their chunk may be stored already),
    and reads inside them (a format check's 64 bytes) are answered from them: no second request."""
    server, root, _ = site
    data = (root / "head.gguf").read_bytes()
    before = len(server.access_log())
    source = _open_source(server, "head.gguf", str(tmp_path / "cache"))
    assert source.pread(0, 64) == data[:64] and source.pread(100, OPEN_HEAD - 100) == data[100:OPEN_HEAD]
    server.wait_idle()  # nginx logs a request once its answer is sent
    assert (0, OPEN_HEAD) in server.ranges("head.gguf", before)
    assert data_ranges(server.ranges("head.gguf", before), len(data)) == []  # (and the weak ETag's tail)
    assert source.pread(OPEN_HEAD - 1, 2) == data[OPEN_HEAD - 1:OPEN_HEAD + 1]  # past them: fetched
    server.wait_idle()
    assert data_ranges(server.ranges("head.gguf", before), len(data))


def test_an_open_with_a_cache_dir_asks_for_the_tail_sample_beside_its_probe(site, tmp_path):
    """nginx's ETag is weak: the open needs the file's last 4 KiB for its identity. With a --cache-dir it asks
    for them as a suffix range beside the probe (no round trip after it), and the identity is the one an open
    asking after its probe finds."""
    server, root, _ = site
    size = (root / "big.gguf").stat().st_size
    before = len(server.access_log())
    beside = _open_source(server, "big.gguf", str(tmp_path / "cache"))
    server.wait_idle()
    asked = [re.search(r'range="([^"]*)"', line)[1] for line in server.access_log()[before:]]
    assert sorted(asked) == ["bytes=-4096", f"bytes=0-{OPEN_HEAD - 1}"], asked
    before = len(server.access_log())
    after = _open_source(server, "big.gguf")  # no --cache-dir: the sample asked once the size is known
    server.wait_idle()
    assert server.ranges("big.gguf", before)[-1] == (size - 4096, size)
    assert beside.content_id() == after.content_id() and "unvalidated" not in beside.content_id()


def test_a_tail_sample_beside_the_probe_that_is_not_the_files_is_asked_again(site, tmp_path, monkeypatch):
    """An answer to the suffix range that is not the probed file's last bytes (another size: a file replaced
    between the two requests, a proxy's odd answer) is dropped, and the open asks for them after its probe."""
    from ckptfs.sources.remote import http

    server, root, _ = site
    size = (root / "big.gguf").stat().st_size
    asked_beside = http._TailAhead._ask

    def another_files(self, deadline):
        asked_beside(self, deadline)
        if self._answer is not None:
            self._answer = (self._answer[0] + 1, *self._answer[1:])

    monkeypatch.setattr(http._TailAhead, "_ask", another_files)
    before = len(server.access_log())
    source = _open_source(server, "big.gguf", str(tmp_path / "cache"))
    server.wait_idle()
    assert server.ranges("big.gguf", before).count((size - 4096, size)) == 2  # the suffix's answer, then asked again
    assert len(server.access_log()) - before == 3
    assert source.content_id() == _open_source(server, "big.gguf").content_id()


def test_random_small_read_fetches_one_block_group(site):
    server, _, _ = site
    with ckptfs.open(server.url + "/big.gguf") as ck:
        t = ck["big.q4k"]
        before = len(server.access_log())
        row = t[3000]
        seen = requests_since(server, before, checks=False)
        checks = tail_checks_since(server, before)
    assert row.shape == (4096,)
    assert len(seen) == 1 and seen[0][2] <= MiB, seen
    assert checks == 1  # then the file's last 4 KiB: still the version opened


def test_missing_url_is_one_line(site):
    server, _, _ = site
    with pytest.raises(CheckpointError, match=r"not found \(HTTP 404\)") as info:
        ckptfs.open(server.url + "/nope.gguf", timeout=5)
    assert "\n" not in str(info.value)


def test_cli_info_of_a_url(site):
    server, root, _ = site
    out = subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "info", "--json", "--timeout", "5",
                          server.url + "/mixed.gguf"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["format"] == "gguf"
    cache = root.parent / "info-cache"
    seen = []
    for _ in range(2):
        before = len(server.access_log())
        again = subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "info", "--json", "--cache-dir", str(cache),
                                server.url + "/vocab.gguf"], capture_output=True, text=True, timeout=120, cwd=REPO)
        assert again.returncode == 0, again.stderr
        seen.append(requests_since(server, before, checks=False))
    assert len(seen[0]) <= 4  # cold: the identity check (the first 4 KiB), then the header as without a cache directory
    assert all(n <= OPEN_HEAD for _, _, n in seen[1])  # warm: only the identity check (and the last 4 KiB's)
    missing = subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "info", server.url + "/none.gguf"],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
    assert missing.returncode == 1
    assert missing.stderr.strip().count("\n") == 0 and "HTTP 404" in missing.stderr


def test_warm_cache_dir_sends_no_data_request(site, tmp_path):
    """A second process with the same --cache-dir reads the bytes the first fetched from the disk store: its
    only request is the identity check at open (the file's first 4 KiB)."""
    server, _, _ = site
    url = server.url + "/big.gguf"
    script = ("import sys, numpy as np, ckptfs\n"
              "ck = ckptfs.open(sys.argv[1], cache_dir=sys.argv[2])\n"
              "t = ck['big.q4k']\n"
              "print(float(np.asarray(t[100:140]).sum()), float(np.asarray(ck['small.f32']).sum()))\n")
    run = lambda: subprocess.run([sys.executable, "-c", script, url, str(tmp_path / "cache")],  # noqa: E731
                                 capture_output=True, text=True, timeout=120, cwd=REPO)
    first = run()
    assert first.returncode == 0, first.stderr
    before = len(server.access_log())
    second = run()
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    seen = requests_since(server, before, checks=False)
    assert seen and all(n <= OPEN_HEAD for _, _, n in seen), seen
    assert tail_checks_since(server, before) == 1  # the version's sample at open, nothing else


def test_mount_http_serves_the_same_files(site, mounted):
    server, root, _ = site
    mnt = mounted(server.url + "/mixed.gguf", "--timeout", "5", "--stall-timeout", "1")
    local = ckptfs.open(root / "mixed.gguf")
    try:
        names = sorted(os.listdir(mnt))
        assert "metadata.json" in names
        npys = [n for n in names if n.endswith(".npy")]
        assert len(npys) == sum(1 for t in local.tensors if t.decodable)
        for name in npys:
            meta = json.loads((mnt / (name[:-4] + ".meta.json")).read_text())
            got = np.load(mnt / name)
            np.testing.assert_array_equal(got, np.asarray(local[meta["name"]]))
            assert meta["source"] == server.url + "/mixed.gguf"
        stats = mount_stats(mnt)["source"]
        assert stats["requests"] >= 1 and stats["bytes"] > 0
    finally:
        local.close()


def test_mount_read_fails_with_eio_when_the_server_fails_then_recovers(site, mounted):
    server, root, _ = site
    with FaultProxy(server.url) as proxy:
        mnt = mounted(proxy.url + "/big.gguf", "--timeout", "3", "--stall-timeout", "1")
        npy = next(p for p in Path(mnt).iterdir() if p.name.startswith("big.q4k") and p.name.endswith(".npy"))
        proxy.always("503")
        start = time.monotonic()
        with open(npy, "rb") as fh:
            fh.seek(48 * MiB)  # stored bytes far past what the open fetched
            with pytest.raises(OSError) as info:
                fh.read(4096)
        assert info.value.errno == errno.EIO
        assert time.monotonic() - start < 3 + 10  # answered by the timeout, not hung
        proxy.always(None)
        with ckptfs.open(root / "big.gguf") as local:
            want = np.asarray(local["big.q4k"]).tobytes()
        with open(npy, "rb") as fh:
            data = fh.read()
        header = len(data) - len(want)
        assert data[header:] == want  # the daemon lived on and serves the right bytes once the server does
        assert mount_stats(mnt)["source"]["retries"] > 0


def test_cli_bench_of_a_url_beside_the_local_file(site):
    """``ckptfs bench URL --local PATH``: the remote workloads beside the local file, counts from the daemon."""
    from conftest import require_fuse
    from gguf import GGUFReader

    require_fuse()
    server, root, _ = site
    out = subprocess.run([sys.executable, "-m", "ckptfs.commands.cli", "bench", server.url + "/mixed.gguf", "--local",
                          str(root / "mixed.gguf"), "--json", "--timeout", "10"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["header_bytes"] == min(t.data_offset for t in GGUFReader(root / "mixed.gguf").tensors)
    remote, local = data["remote"], data["local"]
    assert remote["mount_list"]["requests"] >= 1 and remote["mount_list"]["bytes"] > 0
    assert local["mount_list"]["requests"] == 0
    assert remote["stream"]["npy_bytes"] == local["stream"]["npy_bytes"] > 0
    assert "stream_ratio" in data


def test_a_presigned_urls_signature_is_never_shown(site, mounted):
    """A presigned URL's query is a credential: errors and the world-readable mount table leave it out."""
    server, root, _ = site
    secret = "X-Amz-Signature=0123456789abcdefsecret"
    with pytest.raises(CheckpointError) as info:
        ckptfs.open(f"{server.url}/none.gguf?{secret}", timeout=5)
    assert "HTTP 404" in str(info.value) and "secret" not in str(info.value)
    mnt = mounted(f"{server.url}/mixed.gguf?{secret}", "--timeout", "5")
    assert "metadata.json" in os.listdir(mnt)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
        table = fh.read()
    assert f"{server.url}/mixed.gguf".split("://", 1)[1] in table and "secret" not in table


def test_a_second_mount_with_the_same_cache_dir_fetches_nothing_again(site, mounted, tmp_path):
    server, root, _ = site
    url = server.url + "/big.gguf"
    cache = tmp_path / "cache"
    first = mounted(url, "--cache-dir", str(cache), "--timeout", "10")
    npys = sorted(n for n in os.listdir(first) if n.endswith(".npy"))
    want = {n: (first / n).read_bytes() for n in npys}
    before = len(server.access_log())
    second = mounted(url, "--cache-dir", str(cache), "--timeout", "10")
    for name in npys:
        assert (second / name).read_bytes() == want[name]
    seen = requests_since(server, before, checks=False)
    assert seen and all(n <= OPEN_HEAD for _, _, n in seen), seen  # only the identity checks at open


def test_a_94000_tensor_safetensors_header_in_two_requests(tmp_path):
    """safetensors states its header length up front: the first 2 MiB, then the rest in one request."""
    import struct

    require_nginx()
    entries, offset = {}, 0
    for i in range(94_000):
        entries[f"model.layers.{i // 100}.block.{i % 100}.weight"] = {"dtype": "F32", "shape": [4],
                                                                      "data_offsets": [offset, offset + 16]}
        offset += 16
    header = json.dumps(entries).encode()
    header += b" " * (-len(header) % 8)
    data = np.random.default_rng(0).standard_normal(offset // 4).astype("<f4")
    (tmp_path / "many.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data.tobytes())
    with Nginx(tmp_path) as server:
        with ckptfs.open(server.url + "/many.safetensors") as ck:
            assert len(ck) == 94_000
            seen = requests_since(server, 0, checks=False)
            assert len(seen) == 2 and sum(n for _, _, n in seen) <= 2 * (8 + len(header)) + 2 * MiB
            np.testing.assert_array_equal(np.asarray(ck["model.layers.939.block.99.weight"]), data[-4:])
