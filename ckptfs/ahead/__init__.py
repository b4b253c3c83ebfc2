"""Everything ahead of the reader: the mechanisms that bring bytes or values in before a reader asks.

The words mean one thing each: *read-ahead* fetches **bytes** before a reader asks (a remote source's next
chunks, ``posix_fadvise``), *decode-ahead* decodes a tensor's **blocks** before a sequential reader reaches
them, a *warm-up* brings a **whole file** (or tensor) into ``--cache-dir`` or the shared tiers before anyone
reads. Each recognizes a stream with the one sequential detector (:mod:`ckptfs.ahead.detect`), and the
requests a remote read-ahead or warm-up sends are bounded by each origin's learnt in-flight limit
(:mod:`ckptfs.ahead.limits`). The work runs on the process's worker pools (:mod:`ckptfs.workers`, below).

A low layer: a mechanism here is handed what it works on through a protocol it declares (the way
Mountpoint-S3's ``prefetch/`` is handed its client), so it imports neither the sources nor the engine it
serves. One stream's read-ahead is decided once, by the layer nearest its reader that watches it
(:mod:`ckptfs.ahead.detect`), which says so in the scope of the reads it passes down
(``ckptfs.core.reads.ReadScope.decided``).
"""
