"""The daemon side of a mount: ``ckptfs mount``/``umount`` (checks, the fork, readiness), the mountpoint's
checks and unmount fallbacks, the daemon's log and the Prometheus exporter. It builds what the FUSE adapter
(``ckptfs.fuse``) serves and hands it over; nothing here is imported by ``import ckptfs``.
"""
