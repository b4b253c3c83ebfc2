"""The store's name records (``ckptfs/sources/remote/store/names.py``): what a remote name stood for, kept
with its bytes.

Real files in a temporary folder, read back by the store and by hand. What is proved: a file's record is
written only once bytes of it are stored (never a record before its bytes), at once when some are there
already, and kept as it is while it names the same content (its first fetch's time); a new version replaces
it once the new version's bytes land; a damaged or forged record, or one moved to another name's place, is
no record; a folder's listing is kept at once.
"""

from __future__ import annotations

import os

from ckptfs.sources.remote.store.names import name_path
from ckptfs.sources.remote.store.sparse_store import CHUNK, SparseStore

URL = "http://origin.example/model.gguf"
V1 = 'etag:"1"' + f":{3 * CHUNK}:{URL}"
V2 = 'etag:"2"' + f":{3 * CHUNK}:{URL}"


def _store(tmp_path) -> SparseStore:
    return SparseStore(tmp_path / "cache", 1 << 30)


def test_a_files_record_comes_with_its_first_bytes_never_before(tmp_path):
    store = _store(tmp_path)
    store.pin(V1, URL, {"size": 3 * CHUNK, "fetched_at": 100.0})
    assert store.recall(URL) is None and not os.path.exists(name_path(str(store.dir), URL))
    assert store.put_chunks(V1, 0, [bytes([1]) * CHUNK], 3)
    record = store.recall(URL)
    assert record is not None and record["content_id"] == V1 and record["size"] == 3 * CHUNK

    # a later open of the same version keeps the first fetch's time; its bytes are there: at once
    store.pin(V1, URL, {"size": 3 * CHUNK, "fetched_at": 200.0})
    assert store.recall(URL)["fetched_at"] == 100.0
    # another version replaces it only once its own bytes land
    store.pin(V2, URL, {"size": 3 * CHUNK, "fetched_at": 300.0})
    assert store.recall(URL)["content_id"] == V1
    assert store.put_chunks(V2, 1, [bytes([2]) * CHUNK], 3)
    assert store.recall(URL)["content_id"] == V2 and store.recall(URL)["fetched_at"] == 300.0

    again = _store(tmp_path)  # another process: the same record, from the folder
    assert again.recall(URL)["content_id"] == V2


def test_a_damaged_forged_or_moved_record_is_no_record(tmp_path):
    store = _store(tmp_path)
    store.remember(URL, {"files": {"a.gguf": 10}, "revision": "main"})
    path = name_path(str(store.dir), URL)
    good = open(path, "rb").read()
    assert store.recall(URL)["files"] == {"a.gguf": 10}

    forged = good.replace(b'"a.gguf":10', b'"a.gguf":99')  # the payload changed, the MAC not
    assert forged != good
    open(path, "wb").write(forged)
    assert store.recall(URL) is None
    open(path, "wb").write(good[:-1])  # cut short
    assert store.recall(URL) is None

    other = "http://origin.example/other.gguf"  # a valid record moved to another name's place
    os.makedirs(os.path.dirname(name_path(str(store.dir), other)), exist_ok=True)
    open(name_path(str(store.dir), other), "wb").write(good)
    assert store.recall(other) is None

    keyed = SparseStore(tmp_path / "cache", 1 << 30, key_file=_key(tmp_path))  # another key: not trusted
    open(path, "wb").write(good)
    assert keyed.recall(URL) is None and store.recall(URL) is not None


def _key(tmp_path) -> str:
    path = tmp_path / "other.key"
    path.write_bytes(os.urandom(32))
    os.chmod(path, 0o600)
    return str(path)
