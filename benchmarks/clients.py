"""llama.cpp's time to first token and tokens/s: the file itself, through a mount, over http, downloaded first.

The figures of docs/performance.md (method: docs/clients.md). The model is real-shaped: scripts/make_realistic_gguf.py with Gemma 3 270M
Q4_K_M's header skeleton (its 236 tensor names, types and shapes, its metadata keys, a 262,144-token
vocabulary; random weights), written once as a single file and once as a split set of the same bytes.
llama.cpp is libllama driven by the probe (scripts/llama_client.py; build it with
scripts/build_llama_cpp.sh), run as a fresh process for every measurement, greedy, ``--tokens`` tokens.

Cases, each in every ``--modes`` load mode (mmap: llama.cpp's default; dio: its O_DIRECT loader):

- ``direct``: the single file, its pages dropped from the page cache first (posix_fadvise DONTNEED);
- ``mount``: a fresh mount of the split set (source pages dropped), llama.cpp on its ``model.gguf``;
- ``mount, single file`` and ``http, single file``: a fresh mount of the single file, llama.cpp on the file
  of the same name in it — measured where the mount shows it (the checkpoint's own file in a single-file
  mount), listed as not measured otherwise;
- ``http``: a fresh mount of the split set served by nginx on loopback (``http://127.0.0.1``;
  loopback/servers.py), every byte fetched per range as llama.cpp reads;
- ``download, then load``: the single file fetched from the same nginx by a parallel downloader (8 threads,
  16 MiB ranges, as hf_transfer-style downloaders do), then loaded from local disk: first token = download
  + load;
- ``https, single file`` and ``download over https, then load``: the same two over TLS, from nginx with a
  certificate of a CA made at start (loopback/servers.py ``TestCA``), trusted through ``SSL_CERT_FILE``;
- ``https capped, single file`` and ``download over https capped, then load``: the same from an nginx that
  caps every request at ``--capped-rate`` (nginx's ``limit_rate``, default 20m: 20 MB/s per request, as a
  CDN or object store caps one stream), where parallel ranges pay; ``--capped-rate ''`` leaves them out.

``ttft`` is process start to the first generated token (loading, context, prompt); for the mount cases the
mount's own time (command to ready) is listed beside it and counted in ``cold start``. Every case's greedy
tokens must equal the direct file's (the bench stops otherwise). Every case runs once per round, the rounds
interleaved (on a shared machine other processes' load then falls on all cases alike); the table shows
medians of ``--rounds``.

``--only a,b`` keeps the cases whose name contains one of the words (``--only direct,https``).

Usage: python -m benchmarks clients [--dir DIR] [--rounds 5] [--tokens 64] [--threads 1]
                                    [--modes mmap,dio] [--only WORDS] [--capped-rate 20m] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import ssl
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks import SKELETONS
from ckptfs.bench.harness import drop_page_cache
from ckptfs.bench.remote import BenchMount
from ckptfs.bench import run as bench_run

import llama_client  # scripts/ is on the import path (benchmarks/__init__.py)
from make_realistic_gguf import write_skeleton
from loopback.servers import Nginx, TestCA

SKELETON = SKELETONS / "gemma3-270m-q4_k_m.json"
PIECE = 16 << 20
DOWNLOAD_THREADS = 8


def download(url: str, dest: Path, threads: int = DOWNLOAD_THREADS, piece: int = PIECE) -> float:
    """Fetch ``url`` whole into ``dest`` with ``threads`` parallel range requests; seconds taken."""
    start = time.perf_counter()
    parts = urlsplit(url)

    def connect() -> http.client.HTTPConnection:
        if parts.scheme == "https":  # trusting what ckptfs trusts: SSL_CERT_FILE, else the system's store
            return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=60,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)

    conn = connect()
    conn.request("HEAD", parts.path)
    size = int(conn.getresponse().getheader("Content-Length"))
    conn.close()
    with open(dest, "wb") as f:
        f.truncate(size)
    local = threading.local()
    opened: list[http.client.HTTPConnection] = []

    def fetch(offset: int) -> None:
        if not hasattr(local, "conn"):  # one keep-alive connection per thread
            local.conn = connect()
            opened.append(local.conn)
        end = min(size, offset + piece) - 1
        local.conn.request("GET", parts.path, headers={"Range": f"bytes={offset}-{end}"})
        response = local.conn.getresponse()
        body = response.read()
        if response.status != 206 or len(body) != end - offset + 1:
            raise OSError(f"GET {url} bytes {offset}-{end}: {response.status}, {len(body)} bytes")
        with open(dest, "r+b") as f:
            f.seek(offset)
            f.write(body)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fetch, range(0, size, piece)))
    for conn in opened:
        conn.close()
    return time.perf_counter() - start


def machine() -> dict:
    """ckptfs bench's machine record (CPU, load average, versions) plus the memory size."""
    with open("/proc/meminfo") as f:
        mem = int(next(line.split()[1] for line in f if line.startswith("MemTotal"))) * 1024
    record = bench_run.machine()
    record["load_average_at_start"] = [round(x, 2) for x in record.pop("load_average")]
    return {**record, "memory_gib": round(mem / 2**30, 1)}


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.work = work
        self.machine = machine()
        self.probe = llama_client.probe_path()
        if not self.probe.exists():
            sys.exit(f"clients: {self.probe} is missing: run bash scripts/build_llama_cpp.sh")
        self.www = work / "www"
        self.one = self.www / "one.gguf"
        if not self.one.exists():
            print("clients: writing the model (single file and split set)", file=sys.stderr)
            write_skeleton(str(self.one), str(SKELETON))
            write_skeleton(str(self.www / "split" / "m.gguf"), str(SKELETON), split_max_tensors=64)
        self.shards = sorted((self.www / "split").glob("m-*-of-*.gguf"))
        self.expected: list[int] | None = None
        self.rows: list[dict] = []

    def run(self, model: Path, mode: str) -> dict:
        result = llama_client.run(model, mode, self.args.tokens, self.args.threads, probe=self.probe)
        if self.expected is None:
            self.expected = result["tokens"]
        elif result["tokens"] != self.expected:
            sys.exit(f"clients: {model} ({mode}) generated other tokens than the direct file")
        if mode == "dio" and result["dio_fallback"]:
            sys.exit(f"clients: llama.cpp fell back to buffered reads on {model}: {result['warnings']}")
        return result

    def record(self, case: str, mode: str, rounds: list[dict]) -> None:
        def med(key: str) -> float:
            return statistics.median(r[key] for r in rounds)
        row = {"case": case, "mode": mode, "rounds": len(rounds), "mount_s": med("mount_s"),
               "ttft_s": med("ttft_ms") / 1000, "load_s": med("load_ms") / 1000, "tok_s": med("tok_s"),
               "cold_start_s": statistics.median(r["mount_s"] + r["ttft_ms"] / 1000 for r in rounds),
               "ttft_range_s": [min(r["ttft_ms"] for r in rounds) / 1000, max(r["ttft_ms"] for r in rounds) / 1000],
               "tok_s_range": [min(r["tok_s"] for r in rounds), max(r["tok_s"] for r in rounds)]}
        self.rows.append(row)
        print(f"  {case:24} {mode:5} mount {row['mount_s']:6.2f} s  ttft {row['ttft_s']:6.2f} s  "
              f"{row['tok_s']:6.1f} tok/s", file=sys.stderr)

    def direct(self, mode: str) -> dict:
        drop_page_cache((str(self.one),))
        return {**self.run(self.one, mode), "mount_s": 0.0}

    def mounted(self, src: str, name: str, mode: str, sources: tuple[str, ...]) -> dict | None:
        """A fresh mount of ``src`` (its sources' pages dropped), llama.cpp on ``name`` in it; None where the
        mount does not show ``name``."""
        drop_page_cache(sources)
        with BenchMount(src) as mount:
            if name not in mount.names:
                return None
            return {**self.run(mount.mnt / name, mode), "mount_s": mount.seconds}

    def downloaded(self, url: str, mode: str) -> dict:
        dest = self.work / "downloaded.gguf"
        seconds = download(url, dest)
        result = self.run(dest, mode)
        dest.unlink()
        return {**result, "mount_s": seconds}  # the download stands where a mount's time stands

    def all(self) -> dict:
        """Every case once per round, rounds interleaved, so that the load other processes put on a shared
        machine falls on every case alike; medians per case."""
        shard_paths = tuple(str(p) for p in self.shards)
        one = (str(self.one),)
        not_measured = []
        ca = TestCA(self.work / "ca")
        os.environ["SSL_CERT_FILE"] = str(ca.ca_file)  # the mounts' CLI and the downloader inherit it
        with contextlib.ExitStack() as servers:
            server = servers.enter_context(Nginx(self.www))
            tls = servers.enter_context(Nginx(self.www, tls=ca))
            capped = servers.enter_context(Nginx(self.www, tls=ca, limit_rate=self.args.capped_rate)) \
                if self.args.capped_rate else None
            split_url, one_url = f"{server.url}/split/{self.shards[0].name}", f"{server.url}/{self.one.name}"
            tls_url = f"{tls.url}/{self.one.name}"
            cases = {}
            for mode in self.args.modes:
                cases[("direct", mode)] = lambda m=mode: self.direct(m)
                cases[("mount (split set)", mode)] = lambda m=mode: self.mounted(str(self.shards[0]), "model.gguf",
                                                                                 m, shard_paths)
                cases[("mount, single file", mode)] = lambda m=mode: self.mounted(str(self.one), self.one.name, m,
                                                                                  one)
                cases[("http (split set)", mode)] = lambda m=mode: self.mounted(split_url, "model.gguf", m,
                                                                                shard_paths)
                cases[("http, single file", mode)] = lambda m=mode: self.mounted(one_url, self.one.name, m, one)
                cases[("download, then load", mode)] = lambda m=mode: self.downloaded(one_url, m)
                cases[("https, single file", mode)] = lambda m=mode: self.mounted(tls_url, self.one.name, m, one)
                cases[("download over https, then load", mode)] = lambda m=mode: self.downloaded(tls_url, m)
                if capped is not None:
                    capped_url = f"{capped.url}/{self.one.name}"
                    cases[("https capped, single file", mode)] = lambda m=mode, u=capped_url: self.mounted(
                        u, self.one.name, m, one)
                    cases[("download over https capped, then load", mode)] = lambda m=mode, u=capped_url: \
                        self.downloaded(u, m)
            if self.args.only:
                cases = {key: f for key, f in cases.items() if any(word in key[0] for word in self.args.only)}
            rounds: dict[tuple[str, str], list[dict]] = {key: [] for key in cases}
            for i in range(self.args.rounds):
                print(f"clients: round {i + 1} of {self.args.rounds}", file=sys.stderr)
                for key, measure in list(cases.items()):
                    result = measure()
                    if result is None:
                        not_measured.append(f"{key[0]} ({key[1]}): the mount shows no {self.one.name}")
                        del cases[key], rounds[key]
                        continue
                    rounds[key].append(result)
            for (case, mode), results in rounds.items():
                self.record(case, mode, results)
        return {"machine": self.machine, "model": {"skeleton": SKELETON.name, "bytes": self.one.stat().st_size,
                                                "shards": len(self.shards)},
                "tokens": self.args.tokens, "threads": self.args.threads, "rounds": self.args.rounds,
                "capped_rate": self.args.capped_rate,
                "llama_cpp": str(self.probe), "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                "rows": self.rows, "not_measured": not_measured}


def render(results: dict) -> str:
    m = results["machine"]
    lines = [f"{m['cpu']}, {m['cpus']} CPUs, {m['memory_gib']} GiB; load average at start "
             f"{m['load_average_at_start']}, at end {results['load_average_at_end']}. Model {results['model']['bytes'] / 2**20:.0f} MiB "
             f"({results['model']['skeleton']}), {results['tokens']} tokens, {results['threads']} thread(s), "
             f"median of {results['rounds']}.", "",
             "| case | load mode | mount or download (s) | ttft (s) | cold start (s) | tokens/s | ttft, tokens/s: "
             "min–max |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in results["rows"]:
        (t0, t1), (k0, k1) = r["ttft_range_s"], r["tok_s_range"]
        lines.append(f"| {r['case']} | {r['mode']} | {r['mount_s']:.2f} | {r['ttft_s']:.2f} | "
                     f"{r['cold_start_s']:.2f} | {r['tok_s']:.1f} | {t0:.2f}–{t1:.2f} s, {k0:.1f}–{k1:.1f} |")
    if results["not_measured"]:
        lines.append("")
    for note in results["not_measured"]:
        lines.append(f"not measured: {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="work folder (kept; the model is reused when present)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=["mmap", "dio"])
    parser.add_argument("--only", type=lambda s: s.split(","), default=None,
                        help="keep the cases whose name contains one of these comma-separated words")
    parser.add_argument("--capped-rate", default="20m", help="nginx limit_rate of the capped https origin "
                                                              "('' to leave those cases out)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ckptfs-bench-clients-"))
    work.mkdir(parents=True, exist_ok=True)
    results = Bench(args, work).all()
    print(json.dumps(results, indent=1) if args.json else render(results))
    return 0
