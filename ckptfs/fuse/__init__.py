"""The FUSE adapter: serves a ``MountTree`` as a read-only filesystem.

Nothing here is imported by ``import ckptfs``; the binding (mfusepy or fusepy) and libfuse are loaded only
when a mount is asked for (``ckptfs.fuse.binding.load_binding``), so the library works without libfuse.
"""
