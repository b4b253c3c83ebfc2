"""A real redis-server on a free loopback port, for the Redis tier tests and the tiers benchmark.

``RedisServer().start()`` runs Debian's ``redis-server`` with no persistence (``--save '' --appendonly no``)
and the DEBUG command enabled (``DEBUG SLEEP`` pauses it); ``stop()`` ends it and is safe to call twice.
The tests' fixture that yields a started one, and their check for ``redis-server``, are in
tests/redis_fixtures.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from loopback.servers import MissingTool, free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    def __init__(self, *extra: str, port: int | None = None):
        self.port = port or free_port()
        self.extra = extra
        self.proc: subprocess.Popen | None = None
        self.dir = tempfile.mkdtemp(prefix="ckptfs-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        if not os.access(REDIS_SERVER, os.X_OK):
            raise MissingTool(f"redis-server is not installed ({REDIS_SERVER}; Debian: apt-get install redis-server)")
        cmd = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", self.dir, "--enable-debug-command", "yes", "--protected-mode", "no", *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                if self.command("PING") == b"+PONG":
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not answer PING")

    def command(self, *args: str, timeout: float = 2.0) -> bytes:
        """One command over a raw socket (RESP), the first reply line: independent of the client tested."""
        payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(payload.encode())
            return s.makefile("rb").readline().rstrip(b"\r\n")

    def pause(self, seconds: float) -> None:
        """DEBUG SLEEP: the server answers nothing for ``seconds`` (sent without waiting for the reply)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=2.0)
        s.sendall(f"*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n${len(str(seconds))}\r\n{seconds}\r\n".encode())
        self._paused_socket = s  # closed by stop(); the reply is never read

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        sock = getattr(self, "_paused_socket", None)
        if sock is not None:
            sock.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
