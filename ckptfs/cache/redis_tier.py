"""The ``redis`` cache tier (``--redis redis://HOST:PORT/DB``): decoded block groups shared across machines.

A Redis that is slow, dead, full or holding garbage must cost a decode, never a failed read or a hang:

- **Short timeouts, no retries.** 0.2 s to connect, 0.5 s per command, and redis-py's own retry loop
  switched off (its default retries ten times with backoff: seconds of stall per read).
- **A circuit breaker** (``breaker.py``). The first failed command marks Redis down: lookups are then
  answered "miss" at once, without a socket, while a background thread pings it with a growing backoff
  (1 s up to 30 s). So an outage costs each reader at most one timeout, not one per read.
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

- **One decode per fleet** (``lease``/``wait_for``, asked by ``TieredCache`` after every tier missed):
  the first process to miss a group takes a short lease on it (``SET ckptfs:l1:<digest> NX PX 2000``) and
  decodes; a process that finds the lease taken polls for the value (5 ms, backing off to 50 ms) and takes
  it once stored, or decodes anyway when the lease is gone without a value (its holder died, or could not
  store it and released it) or after ``LEASE_WAIT_S``. Nodes starting together then decode each group once.
  ``lease_many``/``wait_many``/``release_many`` do the same for a batch of keys in one round trip per
  endpoint per step (a pipeline of ``SET NX PX``; the poll is one MGET of the values, then one of the
  leases still pending).

- **Namespaces.** A tier serves one :class:`Namespace`: its key prefixes and lease timings. Decoded groups
  are ``GROUPS`` (``ckptfs:e1:``/``ckptfs:l1:``); the remote sources' fetched chunks are another
  (``ckptfs.sources.remote.store.chunks.BYTES``), held by a tier of their own, so their counters are their own too.

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
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ckptfs.cache import auth, entry
from ckptfs.cache.breaker import Breaker
from ckptfs.cache.counters import TierCounters
from ckptfs.cache.keys import CacheKey
from ckptfs.ahead.detect import SequentialRun
from ckptfs.cache.writer import BackgroundWriter

if TYPE_CHECKING:  # (imported where values are decoded: a remote fetch into the store does not need numpy)
    import numpy as np

log = logging.getLogger(__name__)

KEY_PREFIX = "ckptfs:e1:"
LEASE_PREFIX = "ckptfs:l1:"
LEASE_MS = 2000        # a decoding process's claim on a group lapses after this, whatever became of it
LEASE_WAIT_S = 3.0     # a process waiting for another's decode waits at most this, then decodes
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


@dataclass(frozen=True)
class Namespace:
    """What a tier stores: the Redis key prefixes of its values and leases, and how long a lease holds
    (``lease_ms``: after that it lapses whatever became of its holder) and a waiter waits (``wait_s``)."""

    key_prefix: str
    lease_prefix: str
    lease_ms: int
    wait_s: float

    def key(self, key: str) -> str:
        return self.key_prefix + entry.key_digest(key).hex()

    def lease(self, key: str) -> str:
        return self.lease_prefix + entry.key_digest(key).hex()


#: Decoded block groups (``TieredCache``'s Redis tiers).
GROUPS = Namespace(KEY_PREFIX, LEASE_PREFIX, LEASE_MS, LEASE_WAIT_S)


FAILED = object()  # what ``_command`` returns when the endpoint was down or the command failed


class RedisTier:
    """Get/put decoded groups in Redis; every method returns quickly whatever the server does.

    What a Redis Cluster does differently (``redis_cluster.py``) is confined to five methods: ``_connect``
    (the client), ``_route`` (which endpoint's breaker guards a key), ``_read`` (a batch of GETs: one MGET
    here, one pipeline per node there), ``_batch`` (any batch of one-key commands: one pipeline here, one
    per node there) and ``_where``.
    """

    name = "redis"

    def __init__(self, url: str, connect_timeout: float = CONNECT_TIMEOUT_S, op_timeout: float = OP_TIMEOUT_S,
                 backoff: tuple[float, float] = BACKOFF_S, key_file: str | os.PathLike[str] | None = None,
                 namespace: Namespace = GROUPS) -> None:
        """``key_file``: the key the values are authenticated with (``auth.read_key``; CacheRefused, a
        ValueError, for one others could read); None: the Redis is trusted as-is (logged here, once).
        ``namespace``: what this tier stores (see the module docstring)."""
        self.url = check_url(url)
        self._setup(connect_timeout, op_timeout, backoff, key_file, namespace)

    def _setup(self, connect_timeout: float, op_timeout: float, backoff: tuple[float, float],
               key_file: str | os.PathLike[str] | None, namespace: Namespace = GROUPS) -> None:
        self.namespace = namespace
        try:
            import redis  # noqa: F401 - say now, in one line, what is missing (not at the first read)
        except ImportError:
            raise ValueError(f"--{self.name} needs redis-py: pip install 'ckptfs[redis]' (or: pip install redis)") \
                from None
        self._mac_key = auth.read_key(key_file) if key_file else None
        if self._mac_key is None:
            log.warning("redis %s: no --cache-key-file, so its values are trusted as-is (whoever can write to "
                        "this Redis decides what is served)", self._where())
        self._timeouts = (connect_timeout, op_timeout)
        self._backoff = backoff
        self._client = None
        self._lock = threading.Lock()
        self._writes_paused_until = 0.0
        self._closed = False
        self._breaker = Breaker(self._where(), lambda: self._redis().ping(), self._drop_connections, backoff)
        self._counters = TierCounters(log, ("hits", "misses", "hit_bytes", "stored", "stored_bytes", "corrupt",
                                            "forged", "errors", "skipped", "round_trips", "leases", "waited",
                                            "waited_hits"))
        self._count, self._warn_once = self._counters.add, self._counters.warn_once
        self._ahead: OrderedDict[str, np.ndarray] = OrderedDict()  # fetched with an earlier lookup
        self._ahead_bytes = 0
        self._streams: OrderedDict[str, SequentialRun] = OrderedDict()   # tensor key prefix -> its lookups
        self._leased: set[str] = set()  # keys this process holds the lease of and has not stored yet
        self._token = f"{socket.gethostname()}:{os.getpid()}"
        self._writer = BackgroundWriter(self._put_now, self.name, max_wait=op_timeout, write_many=self._put_many_now)

    # -- the client (what a cluster does differently) ------------------------------------------------

    def _connect(self) -> Any:  # a redis.Redis (redis-py is optional)
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        connect_timeout, op_timeout = self._timeouts
        return redis.Redis.from_url(self.url, socket_connect_timeout=connect_timeout, socket_timeout=op_timeout,
                                    retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0)

    def _redis(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    def _drop_connections(self) -> None:
        with self._lock:
            client = self._client
        if client is not None:
            client.connection_pool.disconnect()

    def _route(self, name: str) -> Breaker | None:
        """The breaker of the endpoint that holds Redis key ``name`` (one server: its only one)."""
        return self._breaker

    def _read(self, names: list[str]) -> list[bytes | None]:
        """The raw values of ``names`` (None: missing or unreachable), one MGET round trip."""
        raw: list[bytes | None] = self._command(names[0], lambda r: r.mget(names))
        if raw is FAILED:
            return [None] * len(names)
        self._count(round_trips=1)
        return raw

    def _batch(self, names: list[str], add: Callable[[Any, str], None], counted: bool = True) -> list[Any]:
        """The replies of one command per Redis key of ``names`` (``add(pipeline, name)`` queues it), sent as
        one pipeline: one round trip (counted in ``round_trips`` unless it is a write, ``counted`` False);
        ``FAILED`` in place of each reply when the endpoint is down or failed."""
        def run(client: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            for name in names:
                add(pipe, name)
            return pipe.execute()

        replies: list[Any] = self._command(names[0], run)
        if replies is FAILED:
            return [FAILED] * len(names)
        self._count(round_trips=int(counted))
        return replies

    def _command(self, name: str, command: Callable[[Any], Any], breaker: Breaker | None = None) -> Any:
        """``command(client)``'s result under the breaker of ``name``'s endpoint; FAILED if it is down or
        the command failed (counted, the breaker told)."""
        breaker = breaker or self._route(name)
        if self._closed or breaker is None or not breaker.available():
            self._count(skipped=1)
            return FAILED
        try:
            result = command(self._redis())
        except Exception as exc:  # noqa: BLE001 - any client or server failure is a miss, never an error
            self._failed(exc, breaker)
            return FAILED
        breaker.succeeded()
        return result

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
        ahead = key.following(READ_AHEAD_GROUPS) if self._continues(key) and isinstance(key, CacheKey) else []
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
        """Values for ``keys`` in one round trip per endpoint (None for each missing, bad or unreachable one)."""
        return self._fetch(list(keys), counted=len(keys))

    def _continues(self, key: str) -> bool:
        """Whether ``key``'s block range starts where this tensor's previous lookup ended (and remember): the
        one sequential detector (``ckptfs.ahead.detect``), exact continuation, one stream per tensor."""
        if not isinstance(key, CacheKey):
            return False
        prefix = key.with_range(0, 0)
        with self._lock:
            run = self._streams.pop(prefix, None) or SequentialRun()
            sequential = run.observe(key.start, key.stop - key.start) > 0
            self._streams[prefix] = run
            if len(self._streams) > _TRACKED_STREAMS:
                self._streams.popitem(last=False)
        return sequential

    def _fetch(self, keys: list[str], counted: int) -> list[np.ndarray | None]:
        """The checked values of ``keys``; the first ``counted`` are lookups (hits and misses), the rest
        read-ahead."""
        if not keys:
            return []
        names = [self.namespace.key(k) for k in keys]
        raw = self._read(names)
        found: list[np.ndarray | None] = [None] * len(keys)
        for i, (key, data) in enumerate(zip(keys, raw)):
            if data is not None:
                found[i] = self._checked(key, names[i], data)
            value = found[i]
            if i < counted:
                if value is None:
                    self._count(misses=1)
                else:
                    self._count(hits=1, hit_bytes=value.nbytes)
        return found

    def _checked(self, key: str, name: str, data: bytes) -> np.ndarray | None:
        """The entry ``data`` decoded for ``key``; None (and the value deleted, counted) when it is bad."""
        try:
            return entry.decode(key, data, mac_key=self._mac_key)
        except entry.BadEntry as exc:
            kind = "forged" if isinstance(exc, entry.ForgedEntry) else "corrupt"
            self._count(**{kind: 1})
            self._warn_once(kind, "redis %s: %s value for %s (%s): deleted, decoding instead "
                            "(further %s values are counted, not logged)", self._where(), kind, name, exc, kind)
            self._command(name, lambda r: r.delete(name))
            return None

    def contains(self, key: str) -> bool:
        name = self.namespace.key(key)
        found = self._command(name, lambda r: r.exists(name))
        return found is not FAILED and bool(found)

    # -- single flight across processes (TieredCache asks tiers that have ``lease``) ---------------------

    def lease(self, key: str) -> bool:
        """Whether this process should decode ``key``, which every tier missed: True when it now holds the
        key's lease (``SET NX PX``: the namespace's ``lease_ms``, then it lapses whatever happens to this
        process) or the tier cannot say (down); False when another process holds it, and ``wait_for`` will
        see its value."""
        return self.lease_many([key])[0]

    def lease_many(self, keys: Sequence[str], ms: int | None = None) -> list[bool]:
        """``lease`` for each of ``keys``, in one pipeline (one round trip per endpoint); ``ms``: how long the
        leases hold (default: the namespace's ``lease_ms``)."""
        if not keys:
            return []
        ms = int(ms) if ms is not None else self.namespace.lease_ms
        replies = self._batch([self.namespace.lease(k) for k in keys],
                              lambda pipe, name: pipe.set(name, self._token, nx=True, px=ms))
        won = [reply is FAILED or bool(reply) for reply in replies]
        taken = [key for key, reply in zip(keys, replies) if reply is not FAILED and reply]
        if taken:
            with self._lock:
                self._leased.update(taken)
            self._count(leases=len(taken))
        return won

    def wait_for(self, key: str, timeout: float | None = None) -> np.ndarray | None:
        """The value another process is decoding under its lease, once it is stored; None (decode it here)
        when the lease is gone without a value (its holder died or could not store it), the tier is down, or
        ``timeout`` (default: the namespace's ``wait_s``) passed. Polls every 5 ms, backing off to 50 ms."""
        return self.wait_many([key], timeout)[0]

    def wait_many(self, keys: Sequence[str], timeout: float | None = None) -> list[np.ndarray | None]:
        """``wait_for`` for each of ``keys`` at once: each poll is one read of the values still missing, then
        one of their leases; a key whose lease is gone (or whose value is bad) is answered None at once."""
        deadline = time.monotonic() + (self.namespace.wait_s if timeout is None else timeout)
        found: list[np.ndarray | None] = [None] * len(keys)
        pending = list(range(len(keys)))
        self._count(waited=len(keys))
        delay = 0.005
        while pending:
            names = [self.namespace.key(keys[i]) for i in pending]
            still = []
            for i, name, data in zip(pending, names, self._read(names)):
                if data is None:
                    still.append(i)
                    continue
                value = self._checked(keys[i], name, data)
                if value is not None:
                    found[i] = value
                    self._count(waited_hits=1, hit_bytes=value.nbytes)
            if not still or time.monotonic() + delay > deadline:
                break
            held = self._batch([self.namespace.lease(keys[i]) for i in still], lambda pipe, name: pipe.exists(name))
            pending = [i for i, h in zip(still, held) if h is not FAILED and h]
            if pending:
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        return found

    def release(self, key: str) -> None:
        """Give up ``key``'s lease without a value (the decode failed, the write was dropped): the processes
        waiting for it decode it themselves at once instead of at the lease's end."""
        self.release_many([key])

    def release_many(self, keys: Sequence[str]) -> None:
        """``release`` for each of ``keys`` this process holds the lease of, in one pipeline."""
        with self._lock:
            mine = [key for key in keys if key in self._leased]
            self._leased.difference_update(mine)
        if mine:
            self._batch([self.namespace.lease(k) for k in mine], lambda pipe, name: pipe.delete(name))

    # -- writes --------------------------------------------------------------------------------------

    def put(self, key: str, value: np.ndarray) -> None:
        """Queue ``value`` for the background writer (the read that decoded it does not wait for Redis); a
        down or full Redis makes this a no-op (counted, logged once)."""
        if time.monotonic() < self._writes_paused_until or self._closed or not self._breaker.available() \
                or not self._writer.submit(key, value):
            self.release(key)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the queued writes (True when all are done)."""
        return self._writer.flush(timeout)

    def _put_now(self, key: str, value: np.ndarray) -> None:
        self._put_many_now([(key, value)])

    def _put_many_now(self, items: list[tuple[str, np.ndarray]]) -> None:
        """SET each value (the writer's thread): one SET, or one pipeline of them (``_batch``) for several."""
        if time.monotonic() < self._writes_paused_until:
            self.release_many([key for key, _ in items])
            return
        values = {}
        for key, value in items:
            header, payload = entry.encode(key, value.reshape(-1), self._mac_key)
            values[self.namespace.key(key)] = (key, header + payload, payload.nbytes)
        names = list(values)
        if len(names) == 1:
            name = names[0]
            replies = [self._command(name, lambda r: r.set(name, values[name][1]))]
        else:
            replies = self._batch(names, lambda pipe, name: pipe.set(name, values[name][1]), counted=False)
        stored = [values[name] for name, reply in zip(names, replies) if reply is not FAILED]
        self.release_many([values[name][0] for name, reply in zip(names, replies) if reply is FAILED])
        with self._lock:
            self._leased.difference_update(key for key, _, _ in stored)  # waiters find the values; the
            # leases lapse by themselves
        if stored:
            self._count(stored=len(stored), stored_bytes=sum(nbytes for _, _, nbytes in stored))

    # -- failures ------------------------------------------------------------------------------------

    def _failed(self, exc: BaseException, breaker: Breaker) -> None:
        import redis  # importable: _setup checked

        self._count(errors=1)
        if _is_oom(exc):
            self._writes_paused_until = time.monotonic() + self._backoff[1]
            self._warn_once("full", "redis %s is full (%s): not storing for %.0f s, lookups go on",
                            breaker.where, exc, self._backoff[1])
            return
        if isinstance(exc, redis.ResponseError) and not isinstance(exc, _outage_errors()):
            self._warn_once(f"response:{exc}", "redis %s: %s", breaker.where, exc)
            return  # the server answered: it is up
        breaker.failed(exc)

    # -- the rest ------------------------------------------------------------------------------------

    def _where(self) -> str:
        return _where(self.url)

    def _up(self) -> bool:
        return not self._breaker.down

    def stats(self) -> dict[str, Any]:
        """This process's counters; ``bytes`` are the bytes served from Redis, ``up`` its state."""
        counts = self._counters.snapshot()
        return {**counts, "bytes": counts["hit_bytes"], "up": int(self._up()), "pending": self._writer.pending,
                "dropped": self._writer.dropped}

    def close(self) -> None:
        self._writer.close(timeout=2.0)
        self._closed = True
        self._breaker.close()
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a client that is being dropped must not fail
                pass


def _where(url: str) -> str:
    """HOST:PORT (or the socket's path) of a checked URL: no password in a log line."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}" if parts.scheme != "unix" else parts.path


def _is_oom(exc: BaseException) -> bool:
    import redis

    oom = getattr(redis.exceptions, "OutOfMemoryError", ())  # probe: third-party (redis-py >= 4.5)
    return isinstance(exc, redis.ResponseError) and (isinstance(exc, oom) or str(exc).startswith("OOM"))


def _outage_errors() -> tuple[type, ...]:
    """Server replies that mean the data is unreachable, not that a command was wrong (a cluster missing
    slots answers CLUSTERDOWN to everything): they trip the breaker like a dead socket."""
    from redis.exceptions import ClusterDownError, MasterDownError

    return (ClusterDownError, MasterDownError)
