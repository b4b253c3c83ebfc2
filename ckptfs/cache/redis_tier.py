"""The ``redis`` cache tier (``--redis redis://HOST:PORT/DB``): decoded block groups shared across machines.

A Redis that is slow, dead, full or holding garbage must cost a decode, never a failed read or a hang:

- **Short timeouts, no retries.** 0.2 s to connect, 0.5 s per command, and redis-py's own retry loop
  switched off (its default retries ten times with backoff: seconds of stall per read).
- **A circuit breaker.** The first failed command marks Redis down: lookups are then answered "miss" at once,
  without a socket, while one background thread pings it after 1 s, then 2, 4 ... up to 30 s, and marks it
  up again once it answers. So an outage costs each reader at most one timeout, not one per read. The pool's
  connections are dropped on failure: a late reply on a timed-out connection is never taken for the next one.
- **Full is not down.** A write refused for memory (``maxmemory`` with ``noeviction``: "OOM command not
  allowed") pauses writes only; lookups go on.
- **Checked values.** A value is the same checksummed entry a disk file holds (``entry.py``), including a
  digest of its cache key, whose text carries the checkpoint's content identity: a value overwritten with
  garbage, or written for another key, is deleted and decoded again. With ``--cache-key-file`` (the same
  file on every machine) each value carries a MAC under that key too, and one that fails it is deleted
  and counted (``forged``): whoever can write to the Redis but lacks the key cannot choose what a mount
  serves. Without a key file the Redis is trusted as-is, and the tier says so once when it is made. Redis keys are ``ckptfs:e1:<blake2b of
  the cache key>``: fixed-length, one namespace for ckptfs on a shared server.
- **Batches.** A lookup that continues the previous one of the same tensor (its block range starts where
  the last one ended) asks in the same MGET round trip for the next ``READ_AHEAD_GROUPS`` groups too
  (keys as ``cache_key`` lays them out, the same width); they wait in a small buffer for the reader. A
  sequential stream then costs one round trip per ``READ_AHEAD_GROUPS + 1`` groups; a random reader
  costs one per group and fetches nothing it did not ask for. ``get_many`` is the batch lookup itself.

- **Writes off the read path.** ``put`` queues the group for a background writer (``writer.py``); a full
  queue holds the reader back for at most the command timeout, then drops the group.

An outage is logged when it starts and when it ends; a full server and bad values once per process (then
counted). redis-py is imported when a tier is made (``--redis`` given), never by ``import ckptfs``; the
client and the writer thread are made at first use, so a daemon's fork happens before any connection or
thread exists.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from urllib.parse import urlsplit

import numpy as np

from ckptfs.cache import auth, entry
from ckptfs.cache.counters import TierCounters
from ckptfs.cache.keys import CacheKey
from ckptfs.cache.writer import BackgroundWriter

log = logging.getLogger(__name__)

KEY_PREFIX = "ckptfs:e1:"
CONNECT_TIMEOUT_S = 0.2
OP_TIMEOUT_S = 0.5
BACKOFF_S = (1.0, 30.0)
READ_AHEAD_GROUPS = 7
AHEAD_MAX_BYTES = 32 << 20   # groups fetched ahead and not yet asked for, at most
_TRACKED_STREAMS = 256


def check_url(url: str) -> str:
    """``url`` if it is a Redis URL redis-py will connect to, else ValueError with a one-line reason (for the
    CLI: a port out of range or a database that is not a number fails here, not in the daemon's log)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"--redis {url!r}: {exc} (want redis://HOST:PORT/DB)") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"--redis wants redis://HOST:PORT/DB, not {url!r}")
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"--redis {url!r} names no socket (want unix:///PATH)")
        return url
    if not parts.hostname:
        raise ValueError(f"--redis {url!r} names no host")
    if port == 0:
        raise ValueError(f"--redis {url!r}: port 0 (want redis://HOST:PORT/DB)")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"--redis {url!r}: database {db!r} is not a number (want redis://HOST:PORT/DB)")
    return url


def redis_key(key: str) -> str:
    return KEY_PREFIX + entry.key_digest(key).hex()


class RedisTier:
    """Get/put decoded groups in Redis; every method returns quickly whatever the server does."""

    name = "redis"

    def __init__(self, url: str, connect_timeout: float = CONNECT_TIMEOUT_S, op_timeout: float = OP_TIMEOUT_S,
                 backoff: tuple[float, float] = BACKOFF_S, key_file: str | os.PathLike | None = None):
        """``key_file``: the key the values are authenticated with (``auth.read_key``; CacheRefused, a
        ValueError, for one others could read); None: the Redis is trusted as-is (logged here, once)."""
        self.url = check_url(url)
        try:
            import redis  # noqa: F401 - say now, in one line, what is missing (not at the first read)
        except ImportError:
            raise ValueError("--redis needs redis-py: pip install 'ckptfs[redis]' (or: pip install redis)") from None
        self._mac_key = auth.read_key(key_file) if key_file else None
        if self._mac_key is None:
            log.warning("redis %s: no --cache-key-file, so its values are trusted as-is (whoever can write to "
                        "this Redis decides what is served)", _where(url))
        self._timeouts = (connect_timeout, op_timeout)
        self._backoff_min, self._backoff_max = backoff
        self._backoff = self._backoff_min
        self._client = None
        self._lock = threading.Lock()
        self._down_until = 0.0      # monotonic: while now < this, Redis is not asked
        self._down = False
        self._writes_paused_until = 0.0
        self._reconnecting = False
        self._reconnector_pid = os.getpid()  # a child forked during an outage has no reconnect thread
        self._closed = False
        self._counters = TierCounters(log, ("hits", "misses", "hit_bytes", "stored", "stored_bytes", "corrupt",
                                            "forged", "errors", "skipped", "round_trips"))
        self._count, self._warn_once = self._counters.add, self._counters.warn_once
        self._ahead: OrderedDict[str, np.ndarray] = OrderedDict()  # fetched with an earlier lookup
        self._ahead_bytes = 0
        self._stream_ends: OrderedDict[str, int] = OrderedDict()   # tensor key prefix -> last block end
        self._writer = BackgroundWriter(self._put_now, "redis", max_wait=op_timeout)

    # -- the client ----------------------------------------------------------------------------------

    def _redis(self):
        with self._lock:
            if self._client is None:
                import redis
                from redis.backoff import NoBackoff
                from redis.retry import Retry

                connect_timeout, op_timeout = self._timeouts
                self._client = redis.Redis.from_url(
                    self.url, socket_connect_timeout=connect_timeout, socket_timeout=op_timeout,
                    retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0)
            return self._client

    def _available(self) -> bool:
        if self._closed or time.monotonic() < self._down_until:
            self._count(skipped=1)
            return False
        return True

    # -- lookups -------------------------------------------------------------------------------------

    def get(self, key: str) -> np.ndarray | None:
        queued = self._writer.lookup(key)
        if queued is not None:
            self._count(hits=1, hit_bytes=queued.nbytes)
            return queued
        with self._lock:
            value = self._ahead.pop(key, None)
            if value is not None:
                self._ahead_bytes -= value.nbytes
        if value is not None:
            self._count(hits=1, hit_bytes=value.nbytes)
            self._continues(key)
            return value
        ahead = key.following(READ_AHEAD_GROUPS) if self._continues(key) else []
        found = self._fetch([key, *ahead], counted=1)
        with self._lock:
            for extra_key, extra in zip(ahead, found[1:]):
                if extra is not None and extra_key not in self._ahead:
                    self._ahead[extra_key] = extra
                    self._ahead_bytes += extra.nbytes
            while self._ahead_bytes > AHEAD_MAX_BYTES:
                _, dropped = self._ahead.popitem(last=False)
                self._ahead_bytes -= dropped.nbytes
        return found[0]

    def get_many(self, keys: Sequence[str]) -> list[np.ndarray | None]:
        """Values for ``keys`` in one round trip (None for each missing, bad or unreachable one)."""
        return self._fetch(list(keys), counted=len(keys))

    def _continues(self, key: str) -> bool:
        """Whether ``key``'s block range starts where this tensor's previous lookup ended (and remember)."""
        if not isinstance(key, CacheKey):
            return False
        prefix, b0, b1 = key.with_range(0, 0), key.start, key.stop
        with self._lock:
            sequential = self._stream_ends.pop(prefix, None) == b0
            self._stream_ends[prefix] = b1
            if len(self._stream_ends) > _TRACKED_STREAMS:
                self._stream_ends.popitem(last=False)
        return sequential

    def _fetch(self, keys: list[str], counted: int) -> list[np.ndarray | None]:
        """MGET ``keys``; the first ``counted`` are lookups (hits and misses), the rest read-ahead."""
        if not keys:
            return []
        found: list[np.ndarray | None] = [None] * len(keys)
        if not self._available():
            self._count(misses=counted)
            return found
        names = [redis_key(k) for k in keys]
        try:
            raw = self._redis().mget(names)
        except Exception as exc:  # noqa: BLE001 - any client or server failure is a miss, never an error
            self._failed(exc)
            self._count(misses=counted)
            return found
        self._succeeded()
        self._count(round_trips=1)
        bad = []
        for i, (key, data) in enumerate(zip(keys, raw)):
            if data is not None:
                try:
                    found[i] = entry.decode(key, data, mac_key=self._mac_key)
                except entry.BadEntry as exc:
                    kind = "forged" if isinstance(exc, entry.ForgedEntry) else "corrupt"
                    bad.append(names[i])
                    self._count(**{kind: 1})
                    self._warn_once(kind, "redis %s: %s value for %s (%s): deleted, decoding instead "
                                    "(further %s values are counted, not logged)", self._where(), kind, names[i],
                                    exc, kind)
            if i < counted:
                if found[i] is None:
                    self._count(misses=1)
                else:
                    self._count(hits=1, hit_bytes=found[i].nbytes)
        if bad:
            self._quietly(lambda r: r.delete(*bad))
        return found

    def contains(self, key: str) -> bool:
        if not self._available():
            return False
        return bool(self._quietly(lambda r: r.exists(redis_key(key))))

    # -- writes --------------------------------------------------------------------------------------

    def put(self, key: str, value: np.ndarray) -> None:
        """Queue ``value`` for the background writer (the read that decoded it does not wait for Redis); a
        down or full Redis makes this a no-op (counted, logged once)."""
        if time.monotonic() < self._writes_paused_until or self._closed or time.monotonic() < self._down_until:
            return
        self._writer.submit(key, value)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the queued writes (True when all are done)."""
        return self._writer.flush(timeout)

    def _put_now(self, key: str, value: np.ndarray) -> None:
        if time.monotonic() < self._writes_paused_until or not self._available():
            return
        header, payload = entry.encode(key, value.reshape(-1), self._mac_key)
        try:
            self._redis().set(redis_key(key), header + payload)
        except Exception as exc:  # noqa: BLE001
            if _is_oom(exc):
                self._writes_paused_until = time.monotonic() + self._backoff_max
                self._count(errors=1)
                self._warn_once("full", "redis %s is full (%s): not storing for %.0f s, lookups go on",
                                self._where(), exc, self._backoff_max)
            else:
                self._failed(exc)
            return
        self._succeeded()
        self._count(stored=1, stored_bytes=payload.nbytes)

    # -- the breaker ---------------------------------------------------------------------------------

    def _quietly(self, command):
        try:
            result = command(self._redis())
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)
            return None
        self._succeeded()
        return result

    def _failed(self, exc: BaseException) -> None:
        import redis  # importable: __init__ checked

        self._count(errors=1)
        if isinstance(exc, redis.ResponseError) and not _is_oom(exc):
            self._warn_once(f"response:{exc}", "redis %s: %s", self._where(), exc)
            return  # the server answered: it is up
        with self._lock:
            client = self._client
            self._down_until = time.monotonic() + self._backoff
            first = not self._down
            self._down = True
            if self._reconnecting and self._reconnector_pid != os.getpid():
                self._reconnecting = False
            start = not self._reconnecting and not self._closed
            self._reconnecting = self._reconnecting or start
            self._reconnector_pid = os.getpid() if start else self._reconnector_pid
        if client is not None:
            try:
                client.connection_pool.disconnect()
            except Exception:  # noqa: BLE001, S110 - dropping dead sockets must not fail
                pass
        if first:
            log.warning("redis %s unreachable (%s: %s): decoding instead, reconnecting in the background",
                        self._where(), type(exc).__name__, exc)
        if start:
            threading.Thread(target=self._reconnect, name="ckptfs-redis-reconnect", daemon=True).start()

    def _succeeded(self) -> None:
        if self._down:
            with self._lock:
                was_down, self._down = self._down, False
                self._down_until = 0.0
                self._backoff = self._backoff_min
            if was_down:
                log.warning("redis %s is back", self._where())

    def _reconnect(self) -> None:
        """Ping after each backoff interval until Redis answers (then lookups resume) or the tier closes."""
        try:
            while not self._closed:
                with self._lock:
                    wait = self._down_until - time.monotonic()
                if wait > 0:
                    time.sleep(min(wait, 0.25))
                    continue
                try:
                    self._redis().ping()
                except Exception:  # noqa: BLE001
                    with self._lock:
                        self._backoff = min(self._backoff * 2, self._backoff_max)
                        self._down_until = time.monotonic() + self._backoff
                    continue
                self._succeeded()
                return
        finally:
            with self._lock:
                self._reconnecting = False

    # -- the rest ------------------------------------------------------------------------------------

    def _where(self) -> str:
        return _where(self.url)

    def stats(self) -> dict:
        """This process's counters; ``bytes`` are the bytes served from Redis, ``up`` its state."""
        counts = self._counters.snapshot()
        return {**counts, "bytes": counts["hit_bytes"], "up": int(not self._down), "pending": self._writer.pending,
                "dropped": self._writer.dropped}

    def close(self) -> None:
        self._writer.close(timeout=2.0)
        self._closed = True
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001, S110
                pass


def _where(url: str) -> str:
    """HOST:PORT (or the socket's path) of a checked URL: no password in a log line."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}" if parts.scheme != "unix" else parts.path


def _is_oom(exc: BaseException) -> bool:
    import redis

    return isinstance(exc, redis.ResponseError) and (isinstance(exc, getattr(redis.exceptions, "OutOfMemoryError", ()))
                                                     or str(exc).startswith("OOM"))
