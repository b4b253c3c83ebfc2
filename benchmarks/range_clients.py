"""The candidates for the remote bulk byte path, range GETs only: urllib3, libcurl (ckptfs's extension, pycurl),
obstore.

Serves one file of ``--mib`` MiB of random bytes with Debian's nginx on 127.0.0.1 (``loopback/servers.py``,
no cap, no proxy) and times each client asking for its bytes three ways:

- ``stream``: pieces of ``--piece-mib`` (8) MiB in file order, one at a time;
- ``8 in flight``: the same pieces, ``--inflight`` (8) at once (threads for a blocking client; the multi
  interface or asyncio for a client that drives its own transfers);
- ``random 1 MiB``: ``--random`` ranges of 1 MiB at random offsets, one at a time (a reader's misses).

Every client writes each piece into a buffer the caller allocated once (the store's write or the FUSE
reply stands behind it), so a client that hands back a buffer of its own pays the copy into it. Figures per
client and pattern: MB/s and CPU-seconds per GB of this process (``getrusage``: the client's own threads,
Rust's or libcurl's, included; nginx excluded), medians of ``--rounds`` rounds, the clients' order reversed
every other round (ABBA). Before timing, each client's bytes are compared with the file (a client that
cannot return the right bytes is not timed).

Beside the figures, what the bulk path needs of a client, checked here where loopback can show it:

- ``abort``: a 32 MiB range behind ``limit_rate 2m`` with a 0.5 s deadline returns (fails) within 3 s;
- ``no redirect``: a 302 from a loopback redirector reaches the caller instead of being followed;
- ``python calls/GB``: how many Python functions a client calls per GB streamed (``sys.setprofile``):
  each is a return into the interpreter under the GIL; a client that holds a transfer outside it makes a few
  per request.

``--s3`` adds the S3 column through moto's S3 server (a Python server: reported, never a bound):
ckptfs's range client through libcurl and through boto3 (``CKPTFS_CURL=0``), obstore's S3Store, and pycurl signing
SigV4 itself.

``--tls`` serves ``https://`` with a throwaway CA instead, handed to each client as ckptfs would hand it (a
file: ``CAINFO``, ``ca_certs``, obstore's ``root_certificate``; ckptfs's own path reads
``REQUESTS_CA_BUNDLE``), and checks that each client refuses the server when it is not handed the CA.

Usage: python -m benchmarks range_clients [--mib 256] [--rounds 5] [--piece-mib 8] [--inflight 8]
       [--random 64] [--tls] [--s3] [--s3-mib 64] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from loopback.servers import MissingTool, MotoS3, Nginx, Redirector, TestCA, environment

MiB = 1 << 20
ABORT_DEADLINE_S = 0.5
ABORT_BOUND_S = 3.0
BUFFER_BYTES = 1 << 20  # libcurl's receive buffer (CURLOPT_BUFFERSIZE): one write callback per MiB at most

Ranges = list[tuple[int, int]]


class Failed(Exception):
    """A client's request did not give the bytes asked for."""


# -- the clients ---------------------------------------------------------------------------------------------
# Each has get(start, end, out): bytes [start, end) into the caller's buffer ``out`` (a memoryview of exactly
# that length), and run(ranges, inflight, buffers): all of ``ranges`` with ``inflight`` at once.


class Client:
    name = ""

    def get(self, start: int, end: int, out: memoryview, deadline: float | None = None) -> None:
        raise NotImplementedError

    def run(self, ranges: Ranges, inflight: int, buffers: list[memoryview]) -> None:
        """Threads for a blocking client: each worker owns one buffer."""
        if inflight == 1:
            for start, end in ranges:
                self.get(start, end, buffers[0][:end - start])
            return
        free = list(buffers[:inflight])
        lock = threading.Lock()

        def one(span: tuple[int, int]) -> None:
            with lock:
                buf = free.pop()
            try:
                self.get(span[0], span[1], buf[:span[1] - span[0]])
            finally:
                with lock:
                    free.append(buf)

        with ThreadPoolExecutor(inflight) as pool:
            list(pool.map(one, ranges))

    def close(self) -> None:
        pass


class CkptfsHttp(Client):
    """ckptfs's own https:// range client (``HttpRange.fetch``) on urllib3 (``CKPTFS_CURL=0``), chunk-sized
    parts copied into the caller's buffer as the store's write would take them."""

    name = "ckptfs urllib3"
    CURL = "0"

    def __init__(self, url: str):
        from ckptfs.sources.remote.http import HttpSource

        with environment({"CKPTFS_CURL": self.CURL}):  # read as the range client is made
            self.range = HttpSource(url).range
        if self.range.native != (self.CURL == "1"):
            raise MissingTool("ckptfs.sources.remote._curl is not built (libcurl4-openssl-dev)")

    def get(self, start: int, end: int, out: memoryview, deadline: float | None = None) -> None:
        from ckptfs.sources.remote.context import ReadContext

        at = 0
        for part in self.range.fetch(start, end, ReadContext(deadline or time.monotonic() + 120)):
            out[at:at + len(part)] = part
            at += len(part)
        if at != end - start:
            raise Failed(f"{at} bytes for {end - start}")


class CkptfsCurl(CkptfsHttp):
    """ckptfs's own range client on libcurl (``_curl.c``: the transfer in C, the body written into the
    chunk-sized parts with one copy), parts copied into the caller's buffer as for ``CkptfsHttp``."""

    name = "ckptfs libcurl"
    CURL = "1"


class CurlInto(Client):
    """ckptfs's libcurl extension on its own (``_curl.get`` with ``into``): the body written straight into
    the caller's buffer, the answer checked once its headers are in (the floor under ``ckptfs libcurl``)."""

    name = "_curl into"

    def __init__(self, url: str, ca: str | None = None):
        from ckptfs.sources.remote import curl

        if curl.native is None:
            raise MissingTool("ckptfs.sources.remote._curl is not built (libcurl4-openssl-dev)")
        self.url, self.ca, self.get_ = url, ca, curl.native.get

    def get(self, start: int, end: int, out: memoryview, deadline: float | None = None) -> None:
        def decide(status: int, reason: str, headers: list[tuple[str, str]]) -> int:
            if status != 206 or not dict(headers).get("content-range", "").startswith(f"bytes {start}-{end - 1}/"):
                raise Failed(f"HTTP {status} {dict(headers).get('content-range')}")
            return 1  # curl.TAKE

        code, message, got, _ = self.get_(self.url, [f"Range: bytes={start}-{end - 1}"], end - start, decide, None,
                                          deadline or time.monotonic() + 120, 30.0, cainfo=self.ca, into=out)
        if code != 0:
            raise Failed(f"libcurl {code}: {message} ({got} bytes)")


class Urllib3Readinto(Client):
    """Plain urllib3: ``preload_content=False``, ``readinto`` slices of the caller's buffer."""

    name = "urllib3 readinto"
    SLICE = 1 << 20

    def __init__(self, url: str, ca: str | None = None):
        import urllib3

        self.url = url
        self.pool = urllib3.PoolManager(maxsize=16, retries=False, **({"ca_certs": ca} if ca else {}))

    def get(self, start: int, end: int, out: memoryview, deadline: float | None = None) -> None:
        resp = self.pool.request("GET", self.url, headers={"Range": f"bytes={start}-{end - 1}"},
                                 preload_content=False, redirect=False, timeout=30.0)
        try:
            if resp.status != 206:
                raise Failed(f"HTTP {resp.status}")
            got = 0
            step = self.SLICE if deadline is None else 64 * 1024
            while got < end - start:
                if deadline is not None and time.monotonic() > deadline:
                    raise Failed("deadline")
                n = resp.readinto(out[got:got + step])
                if not n:
                    raise Failed(f"short body: {got} of {end - start}")
                got += n
        except BaseException:
            resp.close()
            raise
        finally:
            resp.release_conn()


def _curl(url: str, start: int, end: int, out: memoryview, extra: Callable[[object], None] | None = None,
          c=None):
    """An easy handle (``c`` reset for reuse: its connection kept alive) for [start, end) whose write
    callback copies each libcurl buffer into ``out``."""
    import pycurl

    if c is None:
        c = pycurl.Curl()
    else:
        c.reset()
    at = [0]

    def write(data: bytes) -> int:
        n = len(data)
        if at[0] + n > len(out):
            return 0  # more than asked: libcurl ends the transfer with a write error
        out[at[0]:at[0] + n] = data
        at[0] += n
        return n

    c.setopt(pycurl.URL, url)
    c.setopt(pycurl.RANGE, f"{start}-{end - 1}")
    c.setopt(pycurl.WRITEFUNCTION, write)
    c.setopt(pycurl.BUFFERSIZE, BUFFER_BYTES)
    c.setopt(pycurl.FOLLOWLOCATION, 0)
    c.setopt(pycurl.NOSIGNAL, 1)
    if extra is not None:
        extra(c)
    return c, at


def _curl_checked(c, at: list[int], want: int) -> None:
    import pycurl

    status = c.getinfo(pycurl.RESPONSE_CODE)
    if status != 206 or at[0] != want:
        raise Failed(f"HTTP {status}, {at[0]} bytes for {want}")


class CurlEasy(Client):
    """pycurl's easy interface, one blocking ``perform`` per range (threads for several at once), each thread
    reusing its own handle and so its kept-alive connection."""

    name = "pycurl easy"

    def __init__(self, url: str, extra: Callable[[object], None] | None = None):
        self.url, self.extra = url, extra
        self.handles = threading.local()

    def get(self, start: int, end: int, out: memoryview, deadline: float | None = None) -> None:
        import pycurl

        def options(c) -> None:
            if self.extra is not None:
                self.extra(c)
            if deadline is not None:
                c.setopt(pycurl.TIMEOUT_MS, max(1, int((deadline - time.monotonic()) * 1000)))

        c, at = _curl(self.url, start, end, out, options, getattr(self.handles, "curl", None))
        self.handles.curl = c
        try:
            c.perform()
        except pycurl.error as exc:
            raise Failed(str(exc)) from None
        _curl_checked(c, at, end - start)


class CurlMulti(CurlEasy):
    """pycurl's multi interface: one thread drives ``inflight`` transfers (libcurl's event loop, the GIL
    released inside ``select`` and ``perform``)."""

    name = "pycurl multi"

    def run(self, ranges: Ranges, inflight: int, buffers: list[memoryview]) -> None:
        import pycurl

        m = pycurl.CurlMulti()
        todo = list(ranges)
        free = list(buffers[:inflight])
        running: dict[object, tuple[object, list[int], int, memoryview]] = {}
        try:
            while todo or running:
                while todo and free:
                    start, end = todo.pop(0)
                    buf = free.pop()
                    c, at = _curl(self.url, start, end, buf[:end - start], self.extra)
                    m.add_handle(c)
                    running[c] = (c, at, end - start, buf)
                while m.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                    pass
                _, done, failed = m.info_read()
                for c in done:
                    _, at, want, buf = running.pop(c)
                    m.remove_handle(c)
                    _curl_checked(c, at, want)
                    c.close()
                    free.append(buf)
                if failed:
                    raise Failed(f"{failed[0][2]}")
                if running and not done:
                    wait = m.timeout()  # libcurl's own next deadline (0: bytes already decrypted, go on)
                    if wait != 0:
                        m.select(1.0 if wait < 0 else min(wait / 1000, 1.0))
        finally:
            for c, *_ in running.values():
                m.remove_handle(c)
                c.close()
            m.close()


class Obstore(Client):
    """obstore (Rust object_store, reqwest + tokio): ``get_range`` returns a buffer of its own, copied into
    the caller's; several at once through ``get_range_async`` under one asyncio loop."""

    name = "obstore"

    def __init__(self, store, path: str):
        self.store, self.path = store, path

    def get(self, start: int, end: int, out: memoryview, deadline: float | None = None) -> None:
        import obstore

        if deadline is not None:
            asyncio.run(self._get_async(start, end, out, deadline))
            return
        data = obstore.get_range(self.store, self.path, start=start, end=end)
        if len(data) != end - start:
            raise Failed(f"{len(data)} bytes for {end - start}")
        out[:] = memoryview(data)

    async def _get_async(self, start: int, end: int, out: memoryview, deadline: float | None) -> None:
        import obstore

        call = obstore.get_range_async(self.store, self.path, start=start, end=end)
        try:
            data = await (call if deadline is None else asyncio.wait_for(call, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise Failed("deadline") from None
        if len(data) != end - start:
            raise Failed(f"{len(data)} bytes for {end - start}")
        out[:] = memoryview(data)

    def run(self, ranges: Ranges, inflight: int, buffers: list[memoryview]) -> None:
        if inflight == 1:
            super().run(ranges, inflight, buffers)
            return

        async def all_of() -> None:
            free = list(buffers[:inflight])
            gate = asyncio.Semaphore(inflight)

            async def one(start: int, end: int) -> None:
                async with gate:
                    buf = free.pop()
                    try:
                        await self._get_async(start, end, buf[:end - start], None)
                    finally:
                        free.append(buf)

            await asyncio.gather(*(one(s, e) for s, e in ranges))

        asyncio.run(all_of())


def http_store(base: str, extra: dict | None = None, ca: str | None = None):
    from obstore.store import HTTPStore

    trust = {"root_certificate": Path(ca).read_text()} if ca else {}
    return HTTPStore.from_url(base, client_options={"allow_http": True, **trust, **(extra or {})})


def curl_trust(ca: str | None) -> Callable[[object], None] | None:
    """libcurl's CA bundle, handed as a file (``CURLOPT_CAINFO``), as ckptfs would hand what it resolved."""
    if ca is None:
        return None

    def trust(c) -> None:
        import pycurl

        c.setopt(pycurl.CAINFO, ca)

    return trust


def http_clients(url: str, base: str, path: str, ca: str | None = None) -> list[Client]:
    """The candidates for ``url`` (``base`` + ``/`` + ``path``); ``ca``: the CA file each one is handed for
    ``https://`` (ckptfs's own path reads it from ``REQUESTS_CA_BUNDLE``, as its users set it)."""
    return [CkptfsHttp(url), CkptfsCurl(url), CurlInto(url, ca), Urllib3Readinto(url, ca), CurlEasy(url, curl_trust(ca)),
            CurlMulti(url, curl_trust(ca)), Obstore(http_store(base, ca=ca), path)]


def ckptfs_trust(ca_file: Path | None) -> dict[str, str]:
    """The environment that hands ckptfs's own path the CA (``REQUESTS_CA_BUNDLE``), with OpenSSL's own
    variables emptied (ckptfs takes an empty one as unset): else a ``SSL_CERT_FILE`` set for the system's
    store would win, and the other clients' default contexts would trust what they were not handed."""
    if ca_file is None:
        return {}
    return {"REQUESTS_CA_BUNDLE": str(ca_file), "SSL_CERT_FILE": "", "SSL_CERT_DIR": ""}


def trusts_only_what_it_is_handed(url: str, base: str, path: str) -> dict[str, str]:
    """Over ``https://`` with the test CA not handed to them, each client (ckptfs's own apart: its CA comes
    from the environment) must refuse the server: verification is on, not skipped."""
    makers: list[tuple[str, Callable[[], Client]]] = [
        (CurlInto.name, lambda: CurlInto(url)), (Urllib3Readinto.name, lambda: Urllib3Readinto(url)),
        (CurlEasy.name, lambda: CurlEasy(url)),
        (CurlMulti.name, lambda: CurlMulti(url)), (Obstore.name, lambda: Obstore(http_store(base), path))]
    out = {}
    for name, make in makers:
        try:
            make().get(0, 1024, memoryview(bytearray(1024)))
        except Exception as exc:  # noqa: BLE001 - any refusal will do (obstore's at building its client)
            out[name] = f"yes ({type(exc).__name__})"
        else:
            out[name] = "no (an unknown CA was trusted)"
    return out


# -- measuring ---------------------------------------------------------------------------------------------

def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def patterns(size: int, piece: int, inflight: int, randoms: int, seed: int) -> dict[str, tuple[Ranges, int]]:
    pieces = [(s, min(s + piece, size)) for s in range(0, size, piece)]
    rng = random.Random(seed)
    spots = [rng.randrange(0, size - MiB + 1) for _ in range(randoms)]
    return {"stream": (pieces, 1), f"{inflight} in flight": (pieces, inflight),
            "random 1 MiB": ([(s, s + MiB) for s in spots], 1)}


def verify(client: Client, data: bytes, piece: int) -> None:
    """The client's bytes equal the file's: the first piece, one in the middle, the last 1 MiB + 1 bytes."""
    size = len(data)
    for start, end in ((0, min(piece, size)), (size // 2, min(size // 2 + piece, size)), (size - MiB - 1, size)):
        buf = bytearray(end - start)
        client.get(start, end, memoryview(buf))
        if buf != data[start:end]:
            raise Failed(f"{client.name}: bytes {start}-{end - 1} differ from the file's")


def measure(clients: list[Client], size: int, args, label: str) -> dict:
    """{pattern: {client: {"mbps": median, "cpu_s_per_gb": median, "rounds": [...]}}}."""
    work = patterns(size, args.piece_mib * MiB, args.inflight, args.random, seed=1)
    buffers = [memoryview(bytearray(args.piece_mib * MiB)) for _ in range(max(args.inflight, 1))]
    rounds: dict[str, dict[str, list[tuple[float, float]]]] = {p: {c.name: [] for c in clients} for p in work}
    for r in range(args.rounds):
        order = clients if r % 2 == 0 else clients[::-1]
        for pattern, (ranges, inflight) in work.items():
            nbytes = sum(e - s for s, e in ranges)
            for client in order:
                cpu, t0 = _cpu(), time.perf_counter()
                client.run(ranges, inflight, buffers)
                wall, used = time.perf_counter() - t0, _cpu() - cpu
                rate, per_gb = nbytes / wall / 1e6, used / (nbytes / 1e9)
                rounds[pattern][client.name].append((rate, per_gb))
                print(f"{label} round {r + 1} {pattern:13} {client.name:16} {rate:7.0f} MB/s  "
                      f"{per_gb:5.2f} CPU-s/GB", flush=True)
    return {p: {name: {"mbps": round(statistics.median(x for x, _ in rs)),
                       "cpu_s_per_gb": round(statistics.median(y for _, y in rs), 3),
                       "rounds": [[round(x), round(y, 3)] for x, y in rs]}
                for name, rs in per.items()} for p, per in rounds.items()}


def interpreter_calls(client: Client, size: int, piece: int) -> int:
    """Python function calls (``sys.setprofile``) per GB while ``client`` streams the
    file one piece at a time: how often the transfer comes back into the interpreter, each time taking the
    GIL (a count, the same on any machine; timed separately, as profiling slows the calls it counts)."""
    buffers = [memoryview(bytearray(piece))]
    ranges = [(s, min(s + piece, size)) for s in range(0, size, piece)]
    count = [0]

    def profile(frame, event, arg) -> None:
        if event == "call":
            count[0] += 1

    threading.setprofile(profile)  # a client's own worker threads started from here are counted too
    sys.setprofile(profile)
    try:
        client.run(ranges, 1, buffers)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return round(count[0] / (size / 1e9))


def aborts(client: Client, size: int) -> str:
    """"yes (0.52 s)" when a range of up to 32 MiB behind a 2 MB/s cap with a 0.5 s deadline ends within 3 s."""
    n = min(32 * MiB, size)
    buf = memoryview(bytearray(n))
    t0 = time.monotonic()
    try:
        client.get(0, n, buf, deadline=t0 + ABORT_DEADLINE_S)
    except Exception:  # noqa: BLE001 - any failure is the abort; what matters is when it came
        took = time.monotonic() - t0
        return f"{'yes' if took < ABORT_BOUND_S else 'late'} ({took:.2f} s)"
    return f"no (whole range in {time.monotonic() - t0:.2f} s)"


def follows_no_redirect(client: Client) -> str:
    """"yes" when the 302 reaches the caller (the range is not served through it)."""
    try:
        client.get(0, 1024, memoryview(bytearray(1024)))
    except Exception as exc:  # noqa: BLE001 - the 302 surfaced as a failure: not followed
        return f"yes ({str(exc).splitlines()[0][:60]})"
    return "no (followed it)"


def checks(url: str, base: str, path: str, root: Path, piece: int, size: int, ca: TestCA | None) -> dict:
    out: dict[str, dict[str, str | float]] = {}
    cafile = str(ca.ca_file) if ca is not None else None
    for client in http_clients(url, base, path, cafile):
        out[client.name] = {"python calls/GB": interpreter_calls(client, size, piece)}
    if ca is not None:
        for name, refused in trusts_only_what_it_is_handed(url, base, path).items():
            out[name]["refuses an unknown CA"] = refused
    with Nginx(root, limit_rate="2m", tls=ca or False) as slow:
        # obstore's sync call has no deadline of its own: its store's request timeout stands in for it
        slow_clients = http_clients(f"{slow.url}/{path}", slow.url, path, cafile)[:-1] + [
            Obstore(http_store(slow.url, {"timeout": f"{int(ABORT_DEADLINE_S * 1000)}ms"}, cafile), path)]
        for client in slow_clients:
            out[client.name]["abort"] = aborts(client, size)
    with Redirector(base) as redirect:
        hop = redirect.url
        for client in http_clients(f"{hop}/{path}", hop, path, cafile)[2:]:  # ckptfs follows redirects by design
            out[client.name]["no redirect"] = follows_no_redirect(client)
    for ckptfs_client in (CkptfsHttp, CkptfsCurl):
        out[ckptfs_client.name]["no redirect"] = "follows by hand (its own rule)"
    return out


# -- S3 ----------------------------------------------------------------------------------------------------

def s3_clients(moto: MotoS3, bucket: str, key: str) -> list[Client]:
    import pycurl
    from obstore.store import S3Store

    from ckptfs.sources.remote.s3 import S3Source

    env = moto.env()

    class CkptfsS3(Client):
        """ckptfs's ``S3Range.fetch``: through libcurl (``s3_curl``) where it carries them, else boto3."""

        def __init__(self, native: bool):
            self.name = "ckptfs libcurl" if native else "ckptfs boto3"
            self.range = S3Source(f"s3://{bucket}/{key}").range
            if not native:
                self.range.target = False  # what CKPTFS_CURL=0 gives: boto3 carries its range GETs

        def get(self, start: int, end: int, out: memoryview, deadline: float | None = None) -> None:
            from ckptfs.sources.remote.context import ReadContext

            data = self.range.fetch(start, end, ReadContext(deadline or time.monotonic() + 120))
            at = 0
            for part in [data] if isinstance(data, bytes) else data:  # chunk-sized parts from libcurl
                out[at:at + len(part)] = part
                at += len(part)

    def sign(c) -> None:
        c.setopt(pycurl.AWS_SIGV4, f"aws:amz:{env['AWS_DEFAULT_REGION']}:s3")
        c.setopt(pycurl.USERPWD, f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}")

    store = S3Store(bucket, endpoint=moto.endpoint, region=env["AWS_DEFAULT_REGION"],
                    access_key_id=env["AWS_ACCESS_KEY_ID"], secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                    virtual_hosted_style_request=False, client_options={"allow_http": True})
    url = f"{moto.endpoint}/{bucket}/{key}"
    easy, multi = CurlEasy(url, sign), CurlMulti(url, sign)
    return [CkptfsS3(True), CkptfsS3(False), easy, multi, Obstore(store, key)]


def s3_column(data: bytes, args) -> dict:
    import boto3

    with MotoS3() as moto, environment(moto.env()):
        boto3.client("s3", endpoint_url=moto.endpoint).create_bucket(Bucket="bench")
        boto3.client("s3", endpoint_url=moto.endpoint).put_object(Bucket="bench", Key="blob.bin", Body=data)
        clients = s3_clients(moto, "bench", "blob.bin")
        for client in clients:
            verify(client, data, args.piece_mib * MiB)
        return measure(clients, len(data), args, "s3")


# -- main --------------------------------------------------------------------------------------------------

def table(results: dict) -> str:
    lines = []
    for pattern, per in results.items():
        lines.append(f"  {pattern}:")
        for name, fig in per.items():
            lines.append(f"    {name:16} {fig['mbps']:7} MB/s  {fig['cpu_s_per_gb']:6.3f} CPU-s/GB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="file size in MiB [256]")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--piece-mib", type=int, default=8)
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--random", type=int, default=64, help="random 1 MiB ranges per round [64]")
    ap.add_argument("--s3", action="store_true", help="also through moto's S3 server (reported, not a bound)")
    ap.add_argument("--s3-mib", type=int, default=64)
    ap.add_argument("--tls", action="store_true",
                    help="serve https:// with a throwaway CA, handed to each client (the column real origins give)")
    ap.add_argument("--no-checks", action="store_true", help="figures only: skip abort/redirect/GIL checks")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    for module in ("pycurl", "obstore", "urllib3"):
        try:
            __import__(module)
        except ImportError:
            raise MissingTool(f"{module} is not installed (ckptfs's bench extra)") from None
    size = args.mib * MiB
    data = os.urandom(size)
    results: dict = {"machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start",
                     "file_mib": args.mib, "rounds": args.rounds, "tls": args.tls}
    with tempfile.TemporaryDirectory(prefix="ckptfs-range-clients-") as tmp:
        root = Path(tmp)
        (root / "blob.bin").write_bytes(data)
        with Nginx(root, tls=args.tls) as server, environment(ckptfs_trust(server.ca_file)):
            ca = server.ca
            trusted = {"REQUESTS_CA_BUNDLE": str(ca.ca_file)} if ca is not None else {}
            url = f"{server.url}/blob.bin"
            clients = http_clients(url, server.url, "blob.bin", trusted.get("REQUESTS_CA_BUNDLE"))
            for client in clients:
                verify(client, data, args.piece_mib * MiB)
            print("every client's bytes equal the file's", flush=True)
            results["nginx"] = measure(clients, size, args, "nginx")
            if not args.no_checks:
                results["checks"] = checks(url, server.url, "blob.bin", root, args.piece_mib * MiB, size, ca)
    if args.s3:
        results["s3"] = s3_column(data[:args.s3_mib * MiB], args)
    results["load_at_end"] = round(os.getloadavg()[0], 1)
    print(f"\nnginx on loopback{' (https)' if args.tls else ''}, {args.mib} MiB, medians of {args.rounds} rounds ({results['machine']}):")
    print(table(results["nginx"]))
    for name, fig in results.get("checks", {}).items():
        print(f"  {name:16} " + "  ".join(f"{k}: {v}" for k, v in fig.items()))
    if "s3" in results:
        print(f"\nmoto S3 (Python server), {args.s3_mib} MiB:")
        print(table(results["s3"]))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0
