"""What authenticating the shared tiers' entries costs, per GB of decoded values, beside what it saves.

Measures on one core, best of ``--repeat`` runs over ``--mib`` MiB of float32 values cut into 1 MiB entries
(about a decoded block group):

- the MAC candidates alone: HMAC-SHA256 (what ``entry.py`` uses) and keyed BLAKE2b-128, and crc32;
- the real read check, ``entry.decode`` of every entry with the tier's key (the MAC; the payload crc32 is
  skipped) and without one (the crc32 only: a Redis trusted as-is);
- the real write, ``entry.encode`` with a key (crc32 and MAC both);
- what an entry saves: decoding the same number of float32 values from Q4_K and Q8_0 blocks with the C
  kernels (into a touched buffer, ``dequantize_into``) and with the numpy decoders.

Usage: python -m benchmarks cache_mac [--mib 256] [--repeat 5]   (figures in docs/performance.md)
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import time
import zlib

import numpy as np

from ckptfs.cache import entry
from ckptfs.quant import codec_for

ENTRY_BYTES = 1 << 20


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    total = args.mib << 20
    gb = total / 1e9
    key = os.urandom(32)
    rng = np.random.default_rng(0)
    values = rng.standard_normal(total // 4, dtype=np.float32)
    parts = [values[i:i + ENTRY_BYTES // 4] for i in range(0, values.size, ENTRY_BYTES // 4)]
    keys = [f"sha256:{'ab' * 32}|4096|Q4_K|<f4|{i * 4}-{i * 4 + 4}" for i in range(len(parts))]
    rows: list[tuple[str, float]] = []

    def each(fn):
        return lambda: [fn(p) for p in parts]

    rows.append(("HMAC-SHA256", best(each(lambda p: hmac.new(key, p, hashlib.sha256).digest()), args.repeat)))
    rows.append(("keyed BLAKE2b-128", best(each(lambda p: hashlib.blake2b(p, key=key, digest_size=16).digest()),
                                           args.repeat)))
    rows.append(("crc32", best(each(zlib.crc32), args.repeat)))
    keyed = [b"".join(entry.encode(k, p, key)) for k, p in zip(keys, parts)]
    plain = [b"".join(entry.encode(k, p)) for k, p in zip(keys, parts)]
    rows.append(("entry.decode, with a key (MAC)", best(lambda: [entry.decode(k, d, mac_key=key)
                                                                 for k, d in zip(keys, keyed)], args.repeat)))
    rows.append(("entry.decode, no key (crc32)", best(lambda: [entry.decode(k, d) for k, d in zip(keys, plain)],
                                                      args.repeat)))
    rows.append(("entry.encode, with a key", best(lambda: [entry.encode(k, p, key) for k, p in zip(keys, parts)],
                                                  args.repeat)))
    for name in ("Q4_K", "Q8_0"):
        codec = codec_for(name)
        n_blocks = values.size // codec.block_elements
        blocks = rng.integers(0, 256, size=(n_blocks, codec.block_bytes), dtype=np.uint8)
        blocks[:, 0:2] = np.full((n_blocks, 1), 0.01, "<f2").view(np.uint8)  # a sane d (first field of both)
        per = ENTRY_BYTES // 4 // codec.block_elements
        out = np.empty(values.size, np.float32)
        out[...] = 0  # touched: the cost of page faults is not the decode's
        for backend in ("native", "numpy"):
            try:
                codec.decoder(backend)
            except ValueError:
                continue

            def run(backend=backend, codec=codec, blocks=blocks, out=out, per=per, n_blocks=n_blocks):
                for b0 in range(0, n_blocks, per):
                    dst = out[b0 * codec.block_elements:(b0 + per) * codec.block_elements]
                    codec.dequantize_into(blocks[b0:b0 + per], dst, backend=backend)

            rows.append((f"decode {name} ({'C' if backend == 'native' else 'numpy'})", best(run, args.repeat)))
    print(f"{args.mib} MiB of float32 values in 1 MiB entries, best of {args.repeat}, one core")
    print(f"{'':34} {'s/GB':>7} {'GB/s':>7}")
    for label, seconds in rows:
        print(f"{label:34} {seconds / gb:7.3f} {gb / seconds:7.2f}")
    return 0
