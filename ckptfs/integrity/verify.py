"""``ckptfs verify``: compare a checkpoint's stored bytes with a manifest, or check its structure.

With a manifest, the checkpoint is hashed exactly as ``ckptfs manifest`` does (one pass, every hash) and the
two are compared: every file and tensor that is missing, extra, moved or whose bytes differ is one
``Mismatch`` (for changed bytes, which chunks differ, so a user can see a flipped bit from a rewrite).

Without one, what can be known from the checkpoint alone: every tensor's byte range lies inside its file,
no two tensors' bytes overlap (both formats' reference loaders refuse that: safetensors needs contiguous
ranges, llama.cpp expects each tensor where the previous one ended), and where a source knows its content's
sha256 (a Hub file's LFS oid, ``content_id()`` "sha256:<hex>") that the bytes hash to it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ckptfs.integrity.manifest import FileJob, Manifest, Progress, TensorEntry, file_names, hash_files, jobs_for

log = logging.getLogger(__name__)

#: How many differing chunks a mismatch line lists by number before it only counts them.
LISTED_CHUNKS = 8


@dataclass(frozen=True)
class Mismatch:
    file: str | None
    tensor: str | None
    what: str

    def line(self) -> str:
        where = self.file or "<checkpoint>"
        return f"{where}: tensor {self.tensor!r}: {self.what}" if self.tensor is not None else f"{where}: {self.what}"

    def to_json(self) -> dict:
        return asdict(self)


def verify(checkpoint, manifest: Manifest | None = None, *, progress: Progress | None = None,
           workers: int | None = None) -> list[Mismatch]:
    """Every mismatch between ``checkpoint`` and ``manifest`` (or, without one, its structural problems)."""
    if manifest is None:
        return check_structure(checkpoint, progress=progress, workers=workers)
    actual = hash_files(listed_jobs(checkpoint, manifest), chunk_size=manifest.chunk_size, progress=progress,
                        workers=workers, short=True)
    return compare(manifest, actual)


def listed_jobs(checkpoint, manifest: Manifest) -> list[FileJob]:
    """The files of ``checkpoint`` to hash against ``manifest``: its weights, and the folder's other files
    (config, tokenizer...) the manifest lists; when it lists none of them (written before manifests covered
    them) they are left out, said once, rather than each reported as not in the manifest."""
    jobs = jobs_for(checkpoint)
    listed = {f.name for f in manifest.files}
    others = [job for job in jobs if job.other]
    if others and not any(job.name in listed for job in others):
        log.warning("the manifest lists only the weight files: %s and the folder's other files are not checked "
                    "(write it again with `ckptfs manifest` to check them)", others[0].name)
        return [job for job in jobs if not job.other]
    return jobs


def compare(expected: Manifest, actual: Manifest) -> list[Mismatch]:
    """What differs between a manifest and a checkpoint's freshly built one (same chunk size)."""
    actual = _renamed_single_file(expected, actual)
    found: list[Mismatch] = []
    actual_files = {f.name: f for f in actual.files}
    for e in expected.files:
        a = actual_files.pop(e.name, None)
        if a is None:
            found.append(Mismatch(e.name, None, "missing: the manifest lists it, the checkpoint has no such file"))
        elif a.size < e.size:
            found.append(Mismatch(e.name, None, f"size {a.size} bytes, the manifest says {e.size}: "
                                                f"{e.size - a.size} bytes short (a truncated copy?)"))
        elif a.size != e.size:
            found.append(Mismatch(e.name, None, f"size {a.size} bytes, the manifest says {e.size}"))
        elif a.sha256 != e.sha256:
            header = ("; its header (metadata, tensor infos) differs" if e.header_sha256 is not None
                      and a.header_sha256 is not None and a.header_sha256 != e.header_sha256 else "")
            found.append(Mismatch(e.name, None, f"sha256 {a.sha256}, the manifest says {e.sha256}{header}"))
    found += [Mismatch(name, None, "not in the manifest") for name in actual_files]
    sizes = {f.name: f.size for f in actual.files}
    actual_tensors = _by_occurrence(actual.tensors)
    expected_counts, actual_counts = _counts(expected.tensors), _counts(actual.tensors)
    for key, want in _by_occurrence(expected.tensors).items():
        have = actual_tensors.pop(key, None)
        if have is None and key[0] in actual_counts:
            found.append(Mismatch(want.file, want.name,
                                  f"duplicate: the manifest lists it {_times(expected_counts[key[0]])}, "
                                  f"the checkpoint holds it {_times(actual_counts[key[0]])}"))
        elif have is None:
            found.append(Mismatch(want.file, want.name, "missing: the manifest lists it, the checkpoint does not"))
        elif (have.file, have.offset, have.stored_nbytes) != (want.file, want.offset, want.stored_nbytes):
            found.append(Mismatch(have.file, want.name, f"stored at {have.file} bytes {have.offset}..{have.end}, the "
                                                        f"manifest says {want.file} bytes {want.offset}..{want.end}"))
        elif have.present is not None:
            found.append(Mismatch(have.file, want.name,
                                  cut_short(have, sizes.get(have.file, have.offset + have.present))))
        elif have.sha256 != want.sha256 or have.crc32 != want.crc32:
            found.append(Mismatch(have.file, want.name, _changed_bytes(want, have, expected.chunk_size)))
    for (name, _), have in actual_tensors.items():
        what = (f"duplicate: the checkpoint holds it {_times(actual_counts[name])}, the manifest lists it "
                f"{_times(expected_counts[name])}") if name in expected_counts else "not in the manifest"
        found.append(Mismatch(have.file, have.name, what))
    return found


def cut_short(entry: TensorEntry, file_size: int) -> str:
    """What a tensor of a truncated file lacks (``entry.present`` is not None)."""
    if not entry.present:
        return f"missing: its stored bytes {entry.offset}..{entry.end} lie past the end of the file ({file_size} bytes)"
    return (f"truncated: the file ends at byte {file_size}, {entry.stored_nbytes - entry.present} of its "
            f"{entry.stored_nbytes} stored bytes ({entry.offset}..{entry.end}) are missing")


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def _counts(tensors: Sequence[TensorEntry]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in tensors:
        counts[t.name] = counts.get(t.name, 0) + 1
    return counts


def _renamed_single_file(expected: Manifest, actual: Manifest) -> Manifest:
    """A one-file checkpoint checked against a one-file manifest is that file, whatever it is called now."""
    if len(expected.files) != 1 or len(actual.files) != 1 or expected.files[0].name == actual.files[0].name:
        return actual
    old, new = actual.files[0].name, expected.files[0].name
    from dataclasses import replace

    return Manifest(tuple(replace(f, name=new) for f in actual.files),
                    tuple(replace(t, file=new) if t.file == old else t for t in actual.tensors), actual.chunk_size)


def _by_occurrence(tensors: Sequence[TensorEntry]) -> dict[tuple[str, int], TensorEntry]:
    """Tensors keyed by (name, how many of that name came before): duplicates pair up in file order."""
    seen: dict[str, int] = {}
    keyed = {}
    for t in tensors:
        k = seen.get(t.name, 0)
        seen[t.name] = k + 1
        keyed[(t.name, k)] = t
    return keyed


def _changed_bytes(expected: TensorEntry, actual: TensorEntry, chunk_size: int) -> str:
    bad = [k for k, (x, y) in enumerate(zip(expected.chunks_crc32, actual.chunks_crc32)) if x != y]
    n = len(expected.chunks_crc32)
    if bad:
        listed = ", ".join(f"{k} (bytes {expected.offset + k * chunk_size}.."
                           f"{min(expected.end, expected.offset + (k + 1) * chunk_size)})" for k in bad[:LISTED_CHUNKS])
        more = f" and {len(bad) - LISTED_CHUNKS} more" if len(bad) > LISTED_CHUNKS else ""
        where = f"{len(bad)} of {n} chunks differ: {listed}{more}"
    else:  # the chunk crc32s agree, the sha256 does not: a change crc32 cannot see
        where = "sha256 differs though every chunk crc32 matches"
    return f"stored bytes differ from the manifest: {where}"


def check_structure(checkpoint, *, progress: Progress | None = None, workers: int | None = None) -> list[Mismatch]:
    """Problems visible without a manifest (see the module docstring)."""
    names = file_names(list(checkpoint.files))
    found: list[Mismatch] = []
    by_file: dict[str, list] = {path: [] for path in checkpoint.files}
    for info in checkpoint.parsed.tensors:
        by_file[info.source].append(info)
    for path, infos in by_file.items():
        size = checkpoint.sources.get(path).size
        reach_end, reach_name = 0, None
        for info in sorted(infos, key=lambda i: (i.offset, i.offset + i.stored_nbytes)):
            end = info.offset + info.stored_nbytes
            if end > size:
                found.append(Mismatch(names[path], info.name, f"stored bytes {info.offset}..{end} lie past the end "
                                                              f"of the file ({size} bytes)"))
            if info.stored_nbytes and info.offset < reach_end:
                found.append(Mismatch(names[path], info.name, f"stored bytes {info.offset}..{end} overlap those of "
                                                              f"tensor {reach_name!r} (up to byte {reach_end})"))
            if end > reach_end:
                reach_end, reach_name = end, info.name
    found += _check_known_hashes(checkpoint, names, progress, workers)
    return found


def _check_known_hashes(checkpoint, names: dict[str, str], progress: Progress | None,
                        workers: int | None) -> list[Mismatch]:
    """Files whose source knows their sha256 (the Hub's LFS oid) hashed and compared."""
    known: dict[str, str] = {}
    for path in checkpoint.files:
        ident = checkpoint.sources.get(path).content_id()
        if ident.startswith("sha256:"):
            known[path] = ident[len("sha256:"):]
    if not known:
        return []
    jobs = [FileJob(path, names[path], checkpoint.sources.get(path), []) for path in known]
    hashed = hash_files(jobs, progress=progress, workers=workers)
    return [Mismatch(f.name, None, f"sha256 {f.sha256}, the source's recorded sha256 (LFS oid) is {known[job.path]}")
            for job, f in zip(jobs, hashed.files) if f.sha256 != known[job.path]]


def bytes_to_check(checkpoint, manifest: Manifest | None) -> int:
    """How many bytes ``verify`` reads (for a progress bar)."""
    if manifest is not None:
        return sum(job.source.size for job in listed_jobs(checkpoint, manifest))
    total = 0
    for path in checkpoint.files:
        source = checkpoint.sources.get(path)
        if source.content_id().startswith("sha256:"):
            total += source.size
    return total
