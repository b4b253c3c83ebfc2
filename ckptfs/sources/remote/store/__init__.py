"""The fetched-bytes store: where the remote chain keeps the chunks it fetched.

``chunks.py`` (``ChunkCache``: a process's memory LRU of chunks, then the ``--cache-dir`` store, then a Redis
tier shared by a fleet), ``chunk_store.py`` (the protocol of a store beyond memory), ``sparse_store.py`` (one
sparse file per remote file in ``--cache-dir``), ``range_lease.py`` (a chunk fetched once per machine) and
``names.py`` (what a URL stood for, so a checkpoint mounts offline). Only the remote sources use it, so it
lives beside them; what it shares with the decoded groups' tiers (the LRU, the single flight, the entry
MACs, the folder's bound and the Redis tier) is ``ckptfs.cache``'s, below both.
"""
