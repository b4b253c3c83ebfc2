"""The process's worker pools (:mod:`ckptfs.workers.scheduler`): one byte budget over the work in flight,
a pool per kind of work (fetch, decode, read). Work ahead of readers (:mod:`ckptfs.ahead`) and reads that a
caller waits on (the torch loader's next pieces, the manifest's files) run here; no other module starts
worker threads for reading or decoding. Below ``ahead``: it knows nothing of what its jobs do."""
