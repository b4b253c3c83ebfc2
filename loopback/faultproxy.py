"""A loopback HTTP proxy in front of a real server that misbehaves on request, for the remote-source tests.

``FaultProxy(upstream_url)`` forwards GET/HEAD (with their Range) to the upstream and relays the answer.
``plan(*faults)`` queues faults applied to the next requests, one each; ``always(fault)`` applies one to
every request until ``always(None)``. Faults:

- ``"refuse:SECONDS"``: drop this connection without an answer and stop listening for SECONDS (new
  connections are refused);
- ``"reset"``: send the status line, headers and half the body, then reset the connection (RST);
- ``"500"``, ``"503"``, ``"429"`` (optionally ``"429:SECONDS"``/``"503:SECONDS"`` for ``Retry-After``), ``"412"``
  (a refused precondition: S3's answer to an ``If-Match`` on another ETag): that status with a small body
  instead of forwarding;
- ``"slow:SECONDS"``: send the body in 16 pieces, sleeping SECONDS/16 between them;
- ``"stall:SECONDS"``: send headers and half the body, then send nothing for SECONDS;
- ``"short"``: announce the full Content-Length, send half the body, close;
- ``"headers:SECONDS"``: send the status line and headers, then nothing for SECONDS (default 10) and close;
- ``"trickle:SECONDS"``: send the status line and headers, then the body one byte a second, for at most SECONDS
  (default 30), and close (an origin that keeps answering, too slowly to matter);
- ``"etag"``: relay the answer with another ETag (as after the file was replaced);
- ``"total"``: relay the answer with another total in its ``Content-Range`` (one byte more: another file);
- ``"norange"``: forward without the Range header (the upstream answers 200 with the whole file);
- ``"range"``: forward the Range one byte later (``bytes=A-B`` as ``bytes=A+1-B``: the upstream answers another
  range, with its own ``Content-Range``);
- ``"403"``: access denied, as a server that wants credentials answers;
- ``"loop"``: a 302 back to the same URL (a redirect loop).

``every(n, fault)`` applies one to every n-th request (a few bad connections among many in flight).
``chaos(p, faults, seed)`` gives each request, with probability ``p``, one of ``faults`` drawn at random (a
seeded generator: the same run draws the same faults); ``chaos(0)`` ends it.
``requests`` counts forwarded requests by method; ``peers`` holds each request's client port, in order
(which connection it came on: a port not seen before is a fresh connection); ``peak_in_flight`` is the most requests it was serving at
once (how parallel a reader really was, seen from the origin's side).

A network in between, for every request: ``FaultProxy(url, first_byte_delay=0.03)`` waits that long before
forwarding each request (latency to first byte, as a distant object store adds), ``rate=20e6`` paces each
answer's body to that many bytes per second (a per-connection cap, for upstreams that have none, such as
moto's S3 server). Bodies are relayed as they arrive (the faults that cut or alter a body read it whole
first). ``spans`` holds ``(start, end, body bytes)`` of every forwarded GET, in ``time.time()`` seconds, for
counting requests in flight; ``spans_file`` also appends each as a line ``start end bytes``.

``python loopback/faultproxy.py UPSTREAM [--first-byte-delay S] [--rate BPS] [--spans FILE]`` runs one in a
process of its own (benchmarks: its relaying then does not compete with theirs for one interpreter), prints
its URL and serves until its stdin closes.
"""

from __future__ import annotations

import http.client
import http.server
import random
import select
import socket
import struct
import threading
import time
from collections import Counter, deque
from urllib.parse import urlsplit

PIECE = 256 * 1024  # relay and pacing step of a streamed body
_STREAMED = ("", "etag", "norange", "range", "total")  # faults that leave the body as it is


class FaultProxy:
    def __init__(self, upstream_url: str, first_byte_delay: float = 0.0, rate: float | None = None,
                 spans_file: str | None = None):
        parts = urlsplit(upstream_url)
        self._spans_file = open(spans_file, "a", buffering=1) if spans_file else None
        self.upstream = (parts.hostname, parts.port or 80)
        self.first_byte_delay = first_byte_delay
        self.rate = rate
        self.spans: list[tuple[float, float, int]] = []
        self._faults: deque[str] = deque()
        self._always: str | None = None
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._refuse_until = 0.0
        self._running = False
        self._thread: threading.Thread | None = None
        self.requests: Counter = Counter()
        self.peers: list[int] = []
        self.faults_used: list[str] = []
        self._every: tuple[int, str] | None = None
        self._chaos: tuple[float, tuple[str, ...], random.Random] | None = None
        self._seen = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.port = 0
        self.url = ""

    # -- control ---------------------------------------------------------------------------------------
    def plan(self, *faults: str) -> None:
        with self._lock:
            self._faults.extend(faults)

    def always(self, fault: str | None) -> None:
        with self._lock:
            self._always = fault

    def every(self, n: int, fault: str | None) -> None:
        with self._lock:
            self._every = None if fault is None else (n, fault)

    def chaos(self, probability: float, faults: tuple[str, ...] = (), seed: int = 0) -> None:
        with self._lock:
            self._chaos = (probability, tuple(faults), random.Random(seed)) if probability > 0 and faults else None

    def pending(self) -> int:
        with self._lock:
            return len(self._faults)

    def _next_fault(self) -> str | None:
        with self._lock:
            self._seen += 1
            fault = self._faults.popleft() if self._faults else self._always
            if fault is None and self._every is not None and self._seen % self._every[0] == 0:
                fault = self._every[1]
            if fault is None and self._chaos is not None:
                probability, faults, rng = self._chaos
                if rng.random() < probability:
                    fault = rng.choice(faults)
            if fault is not None:
                self.faults_used.append(fault)
            return fault

    # -- serving ---------------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._listen(0)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._running = True
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()
        return self

    def _listen(self, port: int) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(256)
        self._listener = sock

    def _accept_loop(self) -> None:
        while self._running:
            if self._listener is None:
                if time.monotonic() >= self._refuse_until:
                    self._listen(self.port)
                else:
                    time.sleep(0.02)
                    continue
            if self._refuse_until > time.monotonic():
                self._listener.close()
                self._listener = None
                continue
            ready, _, _ = select.select([self._listener], [], [], 0.05)
            if not ready:
                continue
            try:
                conn, addr = self._listener.accept()
            except OSError:
                continue
            if self._refuse_until > time.monotonic():
                # a connection that came between a "refuse" and the listener's closing (a client that
                # reconnects at once, as libcurl does after a reused connection dies): nothing listens
                _reset(conn)
                continue
            threading.Thread(target=self._serve_connection, args=(conn, addr), daemon=True).start()

    def _serve_connection(self, conn: socket.socket, addr) -> None:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # TCP_NODELAY, as nginx and CDNs set: without it a small body written after its headers waits for
            # the client's delayed ACK (up to 40 ms on Linux), a cost no real origin adds to a small request
            disable_nagle_algorithm = True

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                proxy._relay(self, "GET")

            def do_HEAD(self) -> None:
                proxy._relay(self, "HEAD")

        try:
            Handler(conn, addr, None)
        except Exception:  # noqa: BLE001 - a fault that broke the connection on purpose
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def stop(self) -> None:
        self._running = False
        if self._thread is not None:
            self._thread.join(5)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._spans_file is not None:
            with self._lock:
                self._spans_file.close()
                self._spans_file = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- one request -----------------------------------------------------------------------------------
    def _relay(self, req, method: str) -> None:
        with self._lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            self._relay_one(req, method)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _relay_one(self, req, method: str) -> None:
        self.requests[method] += 1
        with self._lock:
            self.peers.append(req.client_address[1])
        received = time.time()
        fault = self._next_fault()
        kind, _, arg = (fault or "").partition(":")
        if kind == "refuse":
            self._refuse_until = time.monotonic() + float(arg or 0.5)
            _reset(req.connection)
            req.close_connection = True
            return
        if kind == "loop":
            req.send_response(302)
            req.send_header("Location", req.path)
            req.send_header("Content-Length", "0")
            req.end_headers()
            return
        if kind in ("500", "503", "429", "403", "412"):
            body = b"injected failure\n"
            req.send_response(int(kind))
            if arg:
                req.send_header("Retry-After", arg)
            req.send_header("Content-Length", str(len(body)))
            req.end_headers()
            req.wfile.write(body)
            return
        headers = {k: v for k, v in req.headers.items() if k.lower() not in ("host", "connection")}
        if kind == "norange":
            headers.pop("Range", None)
            headers.pop("range", None)
        if kind == "range":
            headers = {k: _later(v) if k.lower() == "range" else v for k, v in headers.items()}
        if self.first_byte_delay:
            time.sleep(self.first_byte_delay)
        upstream = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            upstream.request(method, req.path, headers=headers)
            resp = upstream.getresponse()
            if kind in _STREAMED and (method == "HEAD" or resp.getheader("content-length") is not None):
                self._send_headers(req, resp, kind)
                if method == "GET":
                    self._stream_body(req, resp, received)
                return
            body = resp.read()
        finally:
            upstream.close()
        self._send_headers(req, resp, kind)
        if method == "HEAD":
            return
        half = len(body) // 2
        if kind == "reset":
            req.wfile.write(body[:half])
            req.wfile.flush()
            _reset(req.connection)
            req.close_connection = True
        elif kind == "short":
            req.wfile.write(body[:half])
            req.wfile.flush()
            req.connection.shutdown(socket.SHUT_WR)
            req.close_connection = True
        elif kind == "stall":
            req.wfile.write(body[:half])
            req.wfile.flush()
            time.sleep(float(arg or 5))
            req.close_connection = True
        elif kind == "headers":
            req.wfile.flush()
            time.sleep(float(arg or 10))
            req.close_connection = True
        elif kind == "trickle":
            until = time.monotonic() + float(arg or 30)
            for i in range(len(body)):
                if time.monotonic() >= until:
                    break
                req.wfile.write(body[i:i + 1])
                req.wfile.flush()
                time.sleep(1.0)
            req.close_connection = True
        elif kind == "slow":
            pieces = 16
            step = max(1, -(-len(body) // pieces))
            for i in range(0, len(body), step):
                req.wfile.write(body[i:i + step])
                req.wfile.flush()
                time.sleep(float(arg or 1) / pieces)
        else:
            req.wfile.write(body)

    def _send_headers(self, req, resp, kind: str) -> None:
        req.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() in ("connection", "keep-alive", "server", "date"):
                continue
            if kind == "etag" and k.lower() == "etag":
                v = '"replaced-' + v.strip('"') + '"'
            if kind == "total" and k.lower() == "content-range":
                span, _, total = v.rpartition("/")
                v = f"{span}/{int(total) + 1}"
            req.send_header(k, v)
        req.end_headers()

    def _stream_body(self, req, resp, received: float) -> None:
        """Relay the body piece by piece as it comes, paced to ``rate`` bytes per second if set."""
        buf = bytearray(PIECE)
        view = memoryview(buf)
        sent, start = 0, time.monotonic()
        while n := resp.readinto(buf):
            req.wfile.write(view[:n])
            sent += n
            if self.rate:
                ahead = start + sent / self.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        span = (received, time.time(), sent)
        with self._lock:
            self.spans.append(span)
            if self._spans_file is not None:
                self._spans_file.write(f"{span[0]:.6f} {span[1]:.6f} {span[2]:d}\n")


def _later(value: str) -> str:
    """A ``bytes=A-B`` range one byte later at its start (``bytes=A+1-B``); another form as it is."""
    unit, _, span = value.partition("=")
    first, sep, last = span.partition("-")
    if unit.strip() != "bytes" or not sep or not first.isdigit() or not last.isdigit() or int(first) >= int(last):
        return value
    return f"bytes={int(first) + 1}-{last}"


def _reset(conn: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), as a crashed peer or a middlebox does."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="a FaultProxy in a process of its own (until stdin closes)")
    parser.add_argument("upstream")
    parser.add_argument("--first-byte-delay", type=float, default=0.0, help="seconds before forwarding")
    parser.add_argument("--rate", type=float, default=None, help="bytes per second per answer")
    parser.add_argument("--spans", default=None, help="append 'start end bytes' per forwarded GET")
    args = parser.parse_args(argv)
    with FaultProxy(args.upstream, args.first_byte_delay, args.rate, args.spans) as proxy:
        print(proxy.url, flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
