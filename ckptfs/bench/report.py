"""The bench's figures as a table (or JSON), with the targets and whether they were met."""

from __future__ import annotations

from typing import Any

import numpy as np

from ckptfs.util.oneline import one_line
from ckptfs.util.sizes import format_size
from ckptfs.bench.harness import RSS_SLACK
from ckptfs.bench.references import Reference

TARGETS = {"open": 20.0, "random_read": 1000.0, "stream": 2.0}

# Size classes of a tensor (its decoded bytes): real checkpoints mix norms of a few KiB, where per-file
# costs (lookup, open, the first read) dominate, with layer matrices and embeddings of hundreds of MiB.
SMALL_MAX, LARGE_MIN = 64 << 10, 16 << 20
SIZE_CLASSES = ("small <64 KiB", "medium", "large >16 MiB")


def size_class(nbytes: int) -> str:
    return SIZE_CLASSES[0] if nbytes < SMALL_MAX else SIZE_CLASSES[2] if nbytes > LARGE_MIN else SIZE_CLASSES[1]


def group_streams(group_of: dict[str, tuple[str, int]], npy: dict[str, tuple[int, float]],
                  raw: dict[str, tuple[int, float]], reference: dict[str, tuple[int, float]] | None = None
                  ) -> dict[str, dict[str, dict[str, Any]]]:
    """The streams per storage type and per size class: ``{"storage_type"|"size_class": {group: {"count",
    "npy_bytes", "npy_s", "npy_mbs", "raw_bytes", "raw_s", "raw_mbs", "reference_mbs", "stream"}}}``.

    ``group_of``: mount file name -> (storage type, tensor bytes); ``npy``/``raw``: file -> (bytes, seconds)
    as scanned; ``reference``: .npy file -> (bytes, seconds) of the reference library decoding its tensor."""
    groups: dict[str, dict[str, dict[str, Any]]] = {"storage_type": {}, "size_class": {}}

    def add(name: str, kind: str, nbytes: int, seconds: float, decoded: tuple[int, float] | None = None) -> None:
        storage_type, tensor_bytes = group_of[name]
        for axis, key in (("storage_type", storage_type), ("size_class", size_class(tensor_bytes))):
            g = groups[axis].setdefault(key, {"count": 0, "npy_bytes": 0, "npy_s": 0.0, "raw_bytes": 0,
                                              "raw_s": 0.0, "reference_bytes": 0, "reference_s": 0.0})
            g["count"] += kind == "npy" or (kind == "raw" and name[:-4] + ".npy" not in npy)
            g[kind + "_bytes"] += nbytes
            g[kind + "_s"] += seconds
            if decoded is not None:
                g["reference_bytes"] += decoded[0]
                g["reference_s"] += decoded[1]

    for name, (nbytes, seconds) in npy.items():
        add(name, "npy", nbytes, seconds, (reference or {}).get(name))
    for name, (nbytes, seconds) in raw.items():
        add(name, "raw", nbytes, seconds)
    for axis in groups.values():
        for g in axis.values():
            for kind in ("npy", "raw", "reference"):
                g[kind + "_mbs"] = g[kind + "_bytes"] / g[kind + "_s"] / 1e6 if g[kind + "_s"] > 0 else None
            g["stream"] = _ratio(g["npy_mbs"], g["reference_mbs"])
    groups["size_class"] = {k: groups["size_class"][k] for k in SIZE_CLASSES if k in groups["size_class"]}
    return groups


def _percentile(times: np.ndarray, q: float) -> float:
    return float(np.percentile(times, q)) if len(times) else float("nan")


def _summarize(results: dict[str, Any], reference: Reference | None, cache_size: int) -> None:
    """Throughputs, ratios and targets from the raw figures (all in ``results``)."""
    m = results["mount"]
    m["npy_mbs"] = m["npy_bytes"] / m["npy_s"] / 1e6 if m.get("npy_s") else None
    m["raw_mbs"] = m["raw_bytes"] / m["raw_s"] / 1e6 if m.get("raw_s") else None
    m["npy_no_decode_ahead_mbs"] = (m["npy_no_decode_ahead_bytes"] / m["npy_no_decode_ahead_s"] / 1e6
                               if m.get("npy_no_decode_ahead_s") else None)
    ratios: dict[str, float | None] = {
        "npy_over_raw": _ratio(m["npy_mbs"], m["raw_mbs"]),
        "decode_ahead_gain": _ratio(m["npy_mbs"], m["npy_no_decode_ahead_mbs"]),
    }
    limit = cache_size + RSS_SLACK
    targets = [{"name": "daemon peak RssAnon <= cache + 100 MiB", "value": m["daemon_peak_rss_anon"],
                "goal": limit, "met": m["daemon_peak_rss_anon"] <= limit}]
    if reference is not None:
        r = results["reference"] = {
            "library": reference.library, "open_process_s": reference.open_process_s,
            "open_in_process_s": reference.open_in_process_s, "largest_s": reference.largest_s,
            "all_s": reference.all_s, "all_bytes": reference.all_bytes, "all_mbs": reference.all_mbs,
            "compared": reference.compared, "mismatches": reference.mismatches, "skipped": reference.skipped,
            "bytes_equal": not reference.mismatches and reference.compared > 0}
        mount_list = m["ready_s"] + m["listdir_s"]
        ratios["open"] = _ratio(r["open_process_s"], mount_list)
        ratios["first_read"] = _ratio(r["largest_s"], m.get("first_read_s"))
        ratios["random_read_p50"] = _ratio(r["largest_s"], m.get("random_read_p50_s"))
        ratios["stream"] = _ratio(m["npy_mbs"], r["all_mbs"])
        if results["format"] == "gguf":
            for key, name, goal in (("open", "mount + os.listdir vs GGUFReader open (processes)", TARGETS["open"]),
                                    ("random_read_p50", "random 4 KiB read p50 vs dequantize largest",
                                     TARGETS["random_read"]),
                                    ("stream", ".npy stream vs gguf-py dequantization MB/s", TARGETS["stream"])):
                value = ratios[key]
                targets.append({"name": name, "value": value, "goal": goal,
                                "met": value is not None and value >= goal})
    else:
        results["reference"] = None
    results["ratios"] = ratios
    results["targets"] = targets


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def _times(r: float | None) -> str:
    return "-" if r is None else (f"{r:.0f}x" if r >= 10 else f"{r:.2f}x")


def _mbs(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} MB/s"


def render(results: dict[str, Any]) -> str:
    """The human table: one line per figure, the reference and the ratio beside it where there is one."""
    m, r, q = results["mount"], results.get("reference") or {}, results["ratios"]
    ref_name = r.get("library", "")
    rows: list[tuple[str, str, str, str]] = [
        ("mount ready + os.listdir (processes)", _seconds(m["ready_s"] + m["listdir_s"]),
         f"{_seconds(r.get('open_process_s'))} open" if r else "", _times(q.get("open"))),
        ("  mount ready (ckptfs mount returns)", _seconds(m["ready_s"]), "", ""),
        (f"  os.listdir ({m['files']} names)", _seconds(m["listdir_s"]), "", ""),
        ("  reference open in-process", "", _seconds(r.get("open_in_process_s")) if r else "", ""),
    ]
    if "metadata_json_first_s" in m:
        rows.append((f"metadata.json first read ({format_size(m['metadata_json_bytes'])})",
                     _seconds(m["metadata_json_first_s"]), "", ""))
    rows.append((f"ls -l (stat {m['files']} files)", _seconds(m["stat_all_s"]), "", ""))
    if "first_read_s" in m:
        largest = m["largest"]
        before, after = m["first_read_cache_misses"]
        rows += [
            (f"largest .npy: {largest['file']} ({largest['storage_type']}, {format_size(largest['nbytes'])})",
             "", f"{_seconds(r.get('largest_s'))} decode" if r else "", ""),
            (f"  first 4 KiB read, fresh daemon (misses {before}->{after})", _seconds(m["first_read_s"]), "",
             _times(q.get("first_read"))),
            (f"  random 4 KiB read p50 (n={m['random_reads']})", _seconds(m["random_read_p50_s"]), "",
             _times(q.get("random_read_p50"))),
            ("  random 4 KiB read p99", _seconds(m["random_read_p99_s"]), "", ""),
        ]
    if "tensor_cold_s" in m:
        t = m["tensor"]
        rows.append((f"np.load {t['file']} ({format_size(t['nbytes'])}) cold / warm",
                     f"{_seconds(m['tensor_cold_s'])} / {_seconds(m['tensor_warm_s'])}", "", ""))
    if "mmap_open_s" in m:
        rows += [("np.load(mmap_mode='r') of the largest", _seconds(m["mmap_open_s"]), "", ""),
                 ("  random row p50 / p99", f"{_seconds(m['mmap_row_p50_s'])} / {_seconds(m['mmap_row_p99_s'])}",
                  "", "")]
    rows += [
        (f".npy stream, 1 MiB reads ({format_size(m['npy_bytes'])})", _mbs(m["npy_mbs"]),
         f"{_mbs(r.get('all_mbs'))} decode" if r else "", _times(q.get("stream"))),
        ("  decode-ahead off (a fresh daemon)", _mbs(m["npy_no_decode_ahead_mbs"]), "", ""),
        ("  decode-ahead gain", _times(q.get("decode_ahead_gain")), "", ""),
        ("  .npy stream / .raw stream", _times(q.get("npy_over_raw")), "", ""),
        (f".raw stream, 1 MiB reads ({format_size(m['raw_bytes'])})", _mbs(m["raw_mbs"]), "", ""),
        ("daemon peak RssAnon (+children)", format_size(m["daemon_peak_rss_anon"]), "", ""),
    ]
    width = max(len(row[0]) for row in rows)
    header = f"{'':<{width}}  {'ckptfs':>18}  {ref_name:>22}  {'ratio':>7}"
    lines = [_title(results), header, "-" * len(header)]
    lines += [f"{a:<{width}}  {b:>18}  {c:>22}  {d:>7}" for a, b, c, d in rows]
    lines += _render_groups(m.get("groups"), ref_name)
    if results.get("damaged"):
        lines.append(f"damaged tensors, left out of every read: {len(results['damaged'])}")
        lines += [one_line(f"  {d['name']!r}: {d['reason']}") for d in results["damaged"]]
    if results.get("reference_error"):
        lines.append(f"reference library could not read the checkpoint: {results['reference_error']}")
    if r:
        verdict = ("equal" if r["bytes_equal"] else f"DIFFERENT in {len(r['mismatches'])}: "
                   + ", ".join(r["mismatches"][:5]))
        skipped = f" ({len(r['skipped'])} not decodable by {ref_name})" if r["skipped"] else ""
        lines.append(f"values vs {ref_name}: {verdict} ({r['compared']} tensors){skipped}")
    lines.append("targets:")
    for t in results["targets"]:
        value = format_size(t["value"]) if "RssAnon" in t["name"] else _times(t["value"])
        goal = format_size(t["goal"]) if "RssAnon" in t["name"] else f">= {_times(t['goal'])}"
        lines.append(f"  {'met    ' if t['met'] else 'NOT MET'}  {t['name']}: {value} (goal {goal})")
    return "\n".join(lines)


def _render_groups(groups: dict[str, dict[str, dict[str, Any]]] | None, ref_name: str) -> list[str]:
    """The streams per storage type, then per size class: count, .npy MB/s beside the reference's, .raw."""
    if not groups:
        return []
    header = (f"{'streams per group':<22} {'tensors':>7} {'.npy bytes':>10} {'.npy':>10} {ref_name[:12]:>12}"
              f" {'ratio':>7} {'.raw':>10}")
    lines = ["", header, "-" * len(header)]
    for axis, title in (("storage_type", "by storage type"), ("size_class", "by size class (decoded)")):
        lines.append(title)
        for key, g in groups[axis].items():
            lines.append(f"  {key:<20} {g['count']:>7} {format_size(g['npy_bytes']):>10} {_mbs(g['npy_mbs']):>10}"
                         f" {_mbs(g['reference_mbs']):>12} {_times(g['stream']):>7} {_mbs(g['raw_mbs']):>10}")
    return lines


def _title(results: dict[str, Any]) -> str:
    mc = results["machine"]
    load = "/".join(f"{x:.1f}" for x in mc["load_average"])
    return (f"ckptfs bench {results['checkpoint']} ({results['format']}, {results['tensors']} tensors, "
            f"{format_size(results['stored_bytes'])}), cache {format_size(results['cache_size'])}\n"
            f"{mc['cpus']} x {mc['cpu']}, load {load}, Linux {mc['kernel']}, Python {mc['python']}, "
            f"numpy {mc['numpy']}, ckptfs {mc['ckptfs']}\n")
