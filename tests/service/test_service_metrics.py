"""``--metrics``: a real mount's Prometheus endpoint, scraped while reading, against the bytes read.

The scrape is parsed by prometheus-client's own text parser. ``ckptfs_read_bytes_total{kind}`` must equal,
per file kind, exactly the bytes the test's reads returned: O_DIRECT reads (each reaches the daemon as one
request of exactly that range) and whole-file reads of files read for the first time (the page cache asks for
every byte of the file exactly once). The other families are checked against the mount's stats xattr (one
builder serves both), gguf-py's tensor list (storage types decoded) and getrusage's own counters (faults).
The dashboard's queries are checked against the same scrape (every metric they name is served) and run in a
real Prometheus scraping the mount (each is valid PromQL and the main panels get data).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, ckptfs_cli, cli_env, force_unmount, mount_stats, require_fuse, skip_or_fail, wait_until
from fixtures import quantized, write_gguf
from loopback.servers import free_port
from mount_expect import read_direct
from metrics_samples import scrape, value

parser = pytest.importorskip("prometheus_client.parser")

#: The metric names docs/reference/metrics.md fixes.
DOCUMENTED_METRICS = {
    "ckptfs_read_bytes_total", "ckptfs_fuse_requests_total", "ckptfs_fuse_request_seconds",
    "ckptfs_fuse_errors_total", "ckptfs_cache_hits_total", "ckptfs_cache_misses_total", "ckptfs_cache_bytes",
    "ckptfs_decode_seconds", "ckptfs_decoded_bytes_total", "ckptfs_source_bytes_total",
    "ckptfs_source_requests_total", "ckptfs_mirror_failovers_total", "ckptfs_page_faults_total", "ckptfs_info",
    "ckptfs_c_reads_total", "ckptfs_source_shared_bytes_total",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def tensors() -> dict[str, tuple[np.ndarray, str]]:
    rng = np.random.default_rng(14)
    return {
        "blk.0.attn_q.weight": (quantized("Q4_K", (64, 1024), rng), "Q4_K"),
        "blk.0.ffn_up.weight": (rng.standard_normal((128, 512)).astype(np.float32), "Q8_0"),
        "blk.1.attn_q.weight": (quantized("Q6_K", (32, 1024), rng), "Q6_K"),
        "output_norm.weight": (rng.standard_normal(4096).astype(np.float32), "F32"),
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("src") / "model.gguf", tensors(), {"general.name": "metrics"})


@pytest.fixture(scope="module")
def mnt(module_mounted, source) -> Path:
    return module_mounted(source.path, "--metrics", "127.0.0.1:0", "--cache-size", "64M")


def random_direct_reads(path: Path, rng: np.random.Generator, n: int) -> int:
    """``n`` O_DIRECT reads at random page-aligned offsets (some past the end): bytes returned."""
    size = path.stat().st_size
    total = 0
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        for _ in range(n):
            offset = int(rng.integers(0, size // 4096 + 2)) * 4096
            length = int(rng.integers(1, 64)) * 4096
            total += len(os.pread(fd, length, offset))
    finally:
        os.close(fd)
    return total


def test_read_bytes_count_exactly_what_readers_got(mnt, source):
    before = scrape(mnt)
    rng = np.random.default_rng(0)
    got = {"npy": 0, "raw": 0, "json": 0}
    scrapes: list[dict] = []
    done = threading.Event()

    def reader() -> None:
        try:
            got["npy"] += random_direct_reads(mnt / "blk.0.attn_q.weight.npy", rng, 40)
            got["raw"] += random_direct_reads(mnt / "blk.1.attn_q.weight.raw", rng, 20)
            for name in ("blk.0.ffn_up.weight.npy", "output_norm.weight.npy"):  # first reads: every byte once
                got["npy"] += len((mnt / name).read_bytes())
            got["json"] += len((mnt / "metadata.json").read_bytes())
            got["json"] += len((mnt / "blk.1.attn_q.weight.meta.json").read_bytes())
        finally:
            done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    while not done.is_set():  # scraped during the reads: the counters only grow
        scrapes.append(scrape(mnt))
    thread.join()
    after = scrape(mnt)
    def read_bytes(samples, kind):
        return value(samples, "ckptfs_read_bytes_total", kind=kind)

    for kind, n in got.items():
        assert read_bytes(after, kind) - read_bytes(before, kind) == n, kind
    assert read_bytes(after, "file") == read_bytes(after, "hf") == 0
    series = [before, *scrapes, after]
    for a, b in pairwise(series):
        for key in ("npy", "raw"):
            assert value(b, "ckptfs_read_bytes_total", kind=key) >= value(a, "ckptfs_read_bytes_total", kind=key)
    # every read answered in Python was counted as a read request, and timed; those answered in C (the .raw,
    # fuse/direct.py) are counted apart (of its 20 random reads, those past the end never reach the daemon)
    reads = value(after, "ckptfs_fuse_requests_total", op="read")
    in_c = sum(v for (name, _), v in after.items() if name == "ckptfs_c_reads_total")
    assert in_c > 0 and reads + in_c >= 60 and value(after, "ckptfs_fuse_request_seconds_count", op="read") == reads
    assert value(after, "ckptfs_fuse_request_seconds_bucket", op="read", le="+Inf") == reads


def test_decode_cache_and_process_families(mnt, source):
    path = mnt / "blk.1.attn_q.weight.npy"
    path.read_bytes()
    read_direct(path, [(0, path.stat().st_size)])  # an O_DIRECT reader's groups are kept (the page cache has none)
    samples = scrape(mnt)
    stats = mount_stats(mnt)
    decoded_types = {dict(labels)["storage_type"] for (name, labels) in samples if name == "ckptfs_decoded_bytes_total"}
    # every quantized type read so far was decoded; F32 is served from its stored bytes (nothing decoded)
    assert decoded_types == {"Q4_K", "Q8_0", "Q6_K"}
    assert sum(v for (name, _), v in samples.items() if name == "ckptfs_decoded_bytes_total") == stats["decoded_bytes"]
    for storage_type in decoded_types:
        count = value(samples, "ckptfs_decode_seconds_count", storage_type=storage_type)
        assert count >= 1
        assert value(samples, "ckptfs_decode_seconds_bucket", storage_type=storage_type, le="+Inf") == count
        # buckets resolve microsecond decodes: the smallest bound is 5 us
        smallest = tuple(sorted({"storage_type": storage_type, "le": "5e-06"}.items()))
        assert ("ckptfs_decode_seconds_bucket", smallest) in samples
    memory = stats["tiers"]["memory"]
    assert value(samples, "ckptfs_cache_misses_total", tier="memory") == memory["misses"] > 0
    assert value(samples, "ckptfs_cache_hits_total", tier="memory") == memory["hits"]
    assert value(samples, "ckptfs_cache_bytes", tier="memory") == memory["bytes"] > 0
    assert value(samples, "ckptfs_page_faults_total", kind="minor") > 0
    assert ("ckptfs_page_faults_total", (("kind", "major"),)) in samples
    info = [dict(labels) for (name, labels) in samples if name == "ckptfs_info"]
    assert len(info) == 1 and info[0]["source"] == str(source.path) and info[0]["binding"].startswith(stats["binding"])
    # a local mount: the source families are served, at zero, under scheme "file"
    assert value(samples, "ckptfs_source_requests_total", scheme="file", outcome="ok") == 0
    assert ("ckptfs_source_bytes_total", (("scheme", "file"),)) in samples
    assert ("ckptfs_mirror_failovers_total", ()) in samples
    assert stats["source"] == {"requests": 0, "bytes": 0, "retries": 0, "failovers": 0, "shared_bytes": 0,
                               "by_scheme": {}, "origins": {}}
    assert samples[("ckptfs_source_shared_bytes_total", ())] == 0


def test_errors_by_op_and_errno(mnt):
    before = scrape(mnt)
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / "no-such-tensor.npy")
    with pytest.raises(OSError) as info:
        os.open(mnt / "blk.0.attn_q.weight.npy", os.O_WRONLY)
    assert info.value.errno == errno.EROFS
    after = scrape(mnt)
    assert value(after, "ckptfs_fuse_errors_total", op="getattr", errno="ENOENT") \
        == value(before, "ckptfs_fuse_errors_total", op="getattr", errno="ENOENT") + 1
    labels = {k for (name, pairs) in after if name == "ckptfs_fuse_errors_total" for k, _ in pairs}
    assert labels == {"op", "errno"}


def dashboard_queries() -> list[str]:
    board = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    queries += [v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
                for v in board.get("templating", {}).get("list", []) if v.get("type") == "query"]
    return queries


def test_dashboard_queries_name_only_served_contract_metrics(mnt):
    (mnt / "no-such-file").exists()  # one error sample at least
    served = {name for name, _ in scrape(mnt)}
    queries = dashboard_queries()
    assert len(queries) >= 10
    used = set()
    for query in queries:
        names = set(re.findall(r"\b(ckptfs_[a-z0-9_]+)", query))
        assert names, query
        # any other series selector would be a metric outside DOCUMENTED_METRICS
        selectors = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{|\[)", query))
        assert selectors <= names, (query, selectors - names)
        used |= names
    for name in used:
        base = next((name[: -len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)
                     and name[: -len(s)] in DOCUMENTED_METRICS), name)
        assert base in DOCUMENTED_METRICS, name
        assert name in served, f"{name} is not in the scrape"
    # what the dashboard must show (the issue's list)
    for needed in ("ckptfs_cache_hits_total", "ckptfs_decode_seconds_bucket", "ckptfs_read_bytes_total",
                   "ckptfs_fuse_request_seconds_bucket", "ckptfs_fuse_errors_total", "ckptfs_source_requests_total",
                   "ckptfs_mirror_failovers_total", "ckptfs_page_faults_total"):
        assert needed in used, needed


def prometheus_query(port: int, query: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:  # a bad query: Prometheus answers 400 with the reason
        return json.loads(exc.read())


def test_dashboard_queries_run_in_a_real_prometheus(mnt, tmp_path):
    """Prometheus itself scrapes the mount and evaluates every dashboard query (Grafana's variables filled
    in): the exposition parses, every query is valid PromQL, and the main panels get data."""
    if shutil.which("prometheus") is None:
        skip_or_fail("prometheus is not installed (Debian: apt-get install prometheus)")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: ckptfs\n"
                      f"    static_configs:\n      - targets: ['{mount_stats(mnt)['metrics']}']\n")
    log = open(tmp_path / "prometheus.log", "w")
    server = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                               f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    try:
        def scraped_enough() -> bool:
            try:
                (mnt / "blk.0.attn_q.weight.npy").read_bytes()  # reads and decodes keep happening meanwhile
                os.path.exists(mnt / "no-such-file")
                result = prometheus_query(port, 'count_over_time(up{job="ckptfs"}[1m])')["data"]["result"]
                return bool(result) and float(result[0]["value"][1]) >= 5
            except (OSError, KeyError, ValueError):
                return False

        assert wait_until(scraped_enough, timeout=60, interval=0.5), (tmp_path / "prometheus.log").read_text()[-2000:]
        assert prometheus_query(port, 'up{job="ckptfs"}')["data"]["result"][0]["value"][1] == "1"
        empty = []
        for query in dashboard_queries():
            if query.startswith("label_values("):  # Grafana's own function: what it asks Prometheus for
                query = query[len("label_values("):].split(",")[0]
            promql = query.replace("$__rate_interval", "30s").replace("$instance", ".*")
            answer = prometheus_query(port, promql)
            assert answer["status"] == "success", (promql, answer.get("error"))
            if not answer["data"]["result"]:
                empty.append(promql)
        # only what this mount never did may be empty: remote sources, failovers, EIO
        assert all(any(k in q for k in ("source", "failover", 'errno="EIO"')) for q in empty), empty
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_exporter_is_loopback_and_bad_addresses_are_one_line(tmp_path, source, mnt):
    assert mount_stats(mnt)["metrics"].startswith("127.0.0.1:")
    require_fuse()
    (tmp_path / "m").mkdir()
    base = [*ckptfs_cli(), "mount", str(source.path), str(tmp_path / "m")]
    bad = subprocess.run([*base, "--metrics", "localhost:http"], env=cli_env(), capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--metrics" in bad.stderr
    taken = mount_stats(mnt)["metrics"]
    busy = subprocess.run([*base, "--metrics", taken], env=cli_env(), capture_output=True, text=True, timeout=60)
    assert busy.returncode == 1 and "cannot listen" in busy.stderr and len(busy.stderr.strip().splitlines()) == 1
    assert not os.path.ismount(tmp_path / "m")


def test_a_mount_without_metrics_never_imports_prometheus_client():
    code = ("import sys, ckptfs, ckptfs.commands.cli, ckptfs.service.mount, ckptfs.fuse.operations; "
            "assert 'prometheus_client' not in sys.modules, 'imported'")
    subprocess.run([os.sys.executable, "-c", code], env=cli_env(), check=True, timeout=60)


def test_stats_command_table_and_json(mnt):
    (mnt / "blk.0.ffn_up.weight.npy").read_bytes()
    as_json = subprocess.run([*ckptfs_cli(), "stats", str(mnt), "--json"], env=cli_env(), capture_output=True,
                             text=True, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert set(data["source"]) >= {"requests", "bytes", "retries", "failovers"} and data["decoded_bytes"] > 0
    memory = data["tiers"]["memory"]
    assert {"hits", "misses", "bytes"} <= set(memory) and data["pid"] == mount_stats(mnt)["pid"]
    table = subprocess.run([*ckptfs_cli(), "stats", str(mnt)], env=cli_env(), capture_output=True, text=True,
                           timeout=60)
    assert table.returncode == 0, table.stderr
    row = next(line.split() for line in table.stdout.splitlines() if line.startswith("memory "))
    assert int(row[2]) >= memory["misses"] > 0  # (the counters only grow between the two commands)
    assert "source: requests 0" in table.stdout
    not_a_mount = subprocess.run([*ckptfs_cli(), "stats", str(REPO)], env=cli_env(), capture_output=True,
                                 text=True, timeout=60)
    assert not_a_mount.returncode == 1 and "not a ckptfs mount" in not_a_mount.stderr
    assert len(not_a_mount.stderr.strip().splitlines()) == 1


def test_every_configured_tier_is_served(mounted, source, tmp_path):
    """--cache-dir adds the disk tier: a second mount of the same checkpoint is served from it, and its hits
    show under tier="disk" in the scrape and the stats."""
    cache_dir = tmp_path / "cache"
    name = "blk.0.attn_q.weight.npy"
    first = mounted(source.path, "--cache-dir", str(cache_dir), "--metrics", "127.0.0.1:0")
    data = (first / name).read_bytes()
    samples = scrape(first)
    assert value(samples, "ckptfs_cache_misses_total", tier="disk") > 0
    assert set(mount_stats(first)["tiers"]) == {"memory", "disk"}
    force_unmount(first)  # written to the disk tier by now (unmount flushes it)
    second = mounted(source.path, "--cache-dir", str(cache_dir), "--metrics", "127.0.0.1:0")
    assert (second / name).read_bytes() == data
    samples, stats = scrape(second), mount_stats(second)
    assert value(samples, "ckptfs_cache_hits_total", tier="disk") == stats["tiers"]["disk"]["hits"] > 0
    assert value(samples, "ckptfs_cache_bytes", tier="disk") == stats["tiers"]["disk"]["bytes"] > 0
