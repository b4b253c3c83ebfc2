"""Which Python FUSE binding, on which libfuse: chosen once, when a mount is asked for.

mfusepy is preferred (maintained; speaks libfuse 3 and 2; registers only the callbacks we define). When both
libfuse 3 and libfuse 2 are installed, mfusepy 3.x loads libfuse 2 (``find_library("fuse")`` first) unless
``FUSE_LIBRARY_NAME`` / ``FUSE_LIBRARY_PATH`` say otherwise, so we point it at libfuse 3 — measured faster
(docs/mount.md) and the only one current distributions still ship by default. A user's own
``FUSE_LIBRARY_*`` setting wins. fusepy (``import fuse``, libfuse 2 only, unmaintained) is the fallback, and
``CKPTFS_FUSE_BINDING=mfusepy|fusepy`` forces one (the tests run the same checks through both).

Nothing else in ckptfs imports a binding: the library API must work where libfuse is missing.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable
from ctypes.util import find_library
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from ckptfs.fuse.errors import MountError

try:
    from ckptfs.fuse import _listing  # optional C helper (setup.py); without it the loop is Python's
except ImportError:
    _listing = None  # type: ignore[assignment]  # not built: the Python path serves

log = logging.getLogger(__name__)

BINDING_ENV = "CKPTFS_FUSE_BINDING"
BINDINGS = ("mfusepy", "fusepy")

LIBFUSE3_HINT = "install fuse3 and libfuse3-3 (Debian/Ubuntu: apt-get install fuse3 libfuse3-3)"
LIBFUSE2_HINT = "install libfuse2 (Debian: apt-get install libfuse2 fuse3; Ubuntu 24.04: libfuse2t64)"


if TYPE_CHECKING:
    from ckptfs.fuse.direct import DirectReads


class FuseOperations(Protocol):
    """What mfusepy's FUSE classes here call beyond libfuse's operations (``CkptOperations`` has them all)."""

    direct_reads: DirectReads  # reads of plain files served by the C callback (fuse/direct.py)

    def read_into(self, path: str | None, target: memoryview, offset: int, fh: int) -> int:
        """A read written straight into libfuse's reply buffer; the number of bytes written."""
        ...

    def listing_blob(self, path: str | None) -> bytes:
        """A folder's names encoded once, for the C helper's offset-mode listing."""
        ...

    def readdir(self, path: str | None, fh: int) -> list[Any]: ...


@dataclass(frozen=True)
class Binding:
    """A loaded binding: how to run a filesystem with it, and on which libfuse."""

    name: str
    libfuse_major: int
    library: str
    fuse_class: type
    adapt: Callable[[Any], Any]

    @property
    def fusermount(self) -> str:
        """The setuid helper libfuse uses for unprivileged mounts and for ``auto_unmount``."""
        return "fusermount3" if self.libfuse_major == 3 else "fusermount"

    def describe(self) -> str:
        return f"{self.name} on libfuse{self.libfuse_major} ({self.library})"

    def serve(self, operations: FuseOperations, mountpoint: str, options: dict[str, str | bool]) -> None:
        """Run the filesystem until unmounted or signalled (SIGINT/SIGTERM/SIGHUP: libfuse's handlers).

        Always in the foreground and multithreaded: daemonizing is done by us before any thread exists
        (see ``daemon.py``), never by libfuse.
        """
        self.fuse_class(self.adapt(operations), mountpoint, foreground=True, nothreads=False, **options)


class _FusepyAdapter:
    """fusepy calls ``operations(name, *args)`` and probes callbacks with ``getattr``; mfusepy calls
    methods directly (and warns about callable operation objects), so only fusepy gets this wrapper."""

    def __init__(self, operations: Any):
        self._operations = operations

    def __getattr__(self, name: str) -> Any:
        return getattr(self._operations, name)

    def __call__(self, op: str, *args: Any) -> Any:
        return getattr(self._operations, op)(*args)


def _import_mfusepy() -> ModuleType:
    if "mfusepy" in sys.modules or os.environ.get("FUSE_LIBRARY_PATH") or os.environ.get("FUSE_LIBRARY_NAME"):
        return importlib.import_module("mfusepy")
    prefer3 = find_library("fuse3") is not None
    if prefer3:
        os.environ["FUSE_LIBRARY_NAME"] = "fuse3"
    try:
        return importlib.import_module("mfusepy")
    finally:
        if prefer3:
            del os.environ["FUSE_LIBRARY_NAME"]


def _load_mfusepy() -> Binding | None:
    try:
        module = _import_mfusepy()
    except ImportError:
        return None
    except (OSError, AttributeError) as exc:  # mfusepy raises these when libfuse is missing or unusable
        raise MountError(f"libfuse not usable ({exc}): {LIBFUSE3_HINT}") from None
    library = str(getattr(module, "_libfuse_path", "") or "libfuse")  # probe: third-party
    major = int(module.fuse_version_major)
    fuse_class = _reads_in_c(_fast_listings(_reads_into_buffer(module.FUSE), major), module)
    return Binding("mfusepy", major, library, fuse_class, lambda ops: ops)


def _reads_in_c(fuse_class: type, module: Any) -> type:
    """mfusepy's FUSE class with the C read callback of ``ckptfs.fuse.direct`` in libfuse's operations: reads
    of the handles the operations registered (files read as they are: fuse/direct.py) are served on libfuse's threads
    without the GIL; every other read reaches the Python ``read`` as before (the C callback calls it).

    mfusepy builds its ``fuse_operations`` inside ``FUSE.__init__`` and hands it straight to
    ``fuse_main_real`` (which copies it: later changes would not be seen), so the swap is made in a wrapper
    of ``fuse_main_real`` put in mfusepy's module for the duration of ``__init__`` (it blocks until
    unmount): one mount per process, as the daemon is. The Python callback the C one falls back to is made
    here, as mfusepy makes its own, and kept for as long as the mount runs."""

    class CReadFUSE(fuse_class):  # type: ignore[misc]  # the binding's class, known only once loaded
        def __init__(self, operations: FuseOperations, mountpoint: str, *args: Any, **kwargs: Any) -> None:
            direct = operations.direct_reads
            if not direct.enabled:
                super().__init__(operations, mountpoint, *args, **kwargs)
                return
            real_main = module.fuse_main_real
            prototype = dict((f[0], f[1]) for f in module.fuse_operations._fields_)["read"]
            fh_offset = module.fuse_file_info.fh.offset
            kept: list[Any] = []

            def fuse_main_real(argc: Any, argv: Any, ops_pointer: Any, size: Any, user_data: Any) -> Any:  # ctypes
                ops = ops_pointer.contents
                if ctypes.cast(ops.read, ctypes.c_void_p).value:  # mfusepy registered our read
                    try:
                        fallback = prototype(functools.partial(self._wrapper, self.read))
                        kept.append(fallback)
                        python_read = ctypes.cast(fallback, ctypes.c_void_p).value
                        if python_read is None:  # a null callback: nothing the C helper could fall back to
                            raise ValueError("the Python read callback has no address")
                        address = direct.install(python_read, fh_offset)
                    except Exception:  # a helper or an mfusepy that does not fit: reads stay Python's
                        log.warning("reads stay in Python: the C read helper could not be installed", exc_info=True)
                    else:
                        ops.read = prototype(address)
                return real_main(argc, argv, ops_pointer, size, user_data)

            module.fuse_main_real = fuse_main_real
            try:
                super().__init__(operations, mountpoint, *args, **kwargs)
            finally:
                module.fuse_main_real = real_main

    CReadFUSE.__name__ = CReadFUSE.__qualname__ = f"CRead{fuse_class.__name__}"
    return CReadFUSE


def _reads_into_buffer(fuse_class: type) -> type:
    """mfusepy's FUSE class reading straight into the buffer libfuse passes (``operations.read_into``): a
    ``.npy`` read copies its parts (header, slices of cached decoded groups) there once, a ``.raw`` read
    preads there, instead of our ``read`` building bytes that mfusepy then copies: one copy of every byte
    fewer (the operations are ``FuseOperations``)."""

    class BufferReadFUSE(fuse_class):  # type: ignore[misc]  # the binding's class, known only once loaded
        def read(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:  # mfusepy's ctypes
            operations: FuseOperations = self.operations
            read_into = operations.read_into
            fh = fip.contents if self.raw_fi else fip.contents.fh
            # addressof, not ctypes.cast: cast is a foreign call that lets go of the GIL and, under load,
            # waits to get it back (5% of a loaded daemon's samples)
            target = memoryview((ctypes.c_char * size).from_address(ctypes.addressof(buf.contents)))
            return read_into(None if path is None else path.decode(self.encoding, self.errors), target.cast("B"),
                             offset, fh)

    BufferReadFUSE.__name__ = BufferReadFUSE.__qualname__ = f"BufferRead{fuse_class.__name__}"
    return BufferReadFUSE


def _fast_listings(fuse_class: type, libfuse_major: int) -> type:
    """mfusepy's FUSE class with a cheaper ``readdir``: a mount's folders never change while mounted, so each
    folder's names are encoded to bytes once and handed to libfuse's filler directly. mfusepy's generic loop
    inspects and encodes every name on every listing; for a folder of 282,000 names (a 94k-tensor
    checkpoint) that was most of the time of an ``ls``. With the C helper the listing is given in libfuse's
    offset mode (each name's offset is the byte position of the next one in the blob): each READDIR request
    fills one reply buffer from where the last one ended, so libfuse does not keep one allocation per entry
    of the whole folder (about 60 MiB for 282,000 names, held by the daemon afterwards).

    (Letting the kernel cache listings, ``cache_readdir`` on ``opendir``, would avoid the round trip
    altogether, but libfuse's high-level API, which mfusepy wraps, does not pass that flag on.)
    """

    class FastListingsFUSE(fuse_class):  # type: ignore[misc]  # the binding's class, known only once loaded
        def _readdir(self, path: bytes | None, buf: Any, filler: Any, offset: int, fip: Any) -> int:  # mfusepy's ctypes
            decoded = None if path is None else path.decode(self.encoding, self.errors)
            cache = self.__dict__.setdefault("_ckptfs_listings", {})
            names = cache.get(decoded)
            if names is None and _listing is not None and self.encoding == "utf-8":
                names = cache[decoded] = self.operations.listing_blob(decoded)
            if names is None:
                listing = self.operations.readdir(decoded, fip.contents.fh)
                if any(not isinstance(item, str) for item in listing):
                    generic: int = super()._readdir(path, buf, filler, offset, fip)
                    return generic
                encoded = [name.encode(self.encoding, self.errors) for name in listing]
                # with the C helper, one NUL-separated blob (about 40 bytes a name) is all that is kept
                names = cache[decoded] = b"\0".join(encoded) + b"\0" if _listing is not None else encoded
            if _listing is not None:  # offset mode: one reply buffer per call, from byte `offset` of the blob
                _listing.fill_from(ctypes.cast(filler, ctypes.c_void_p).value or 0,
                                   ctypes.cast(buf, ctypes.c_void_p).value or 0, names, libfuse_major, offset)
                return 0
            args = (None, 0, 0) if libfuse_major == 3 else (None, 0)
            for name in names:
                if filler(buf, name, *args):
                    break
            return 0

    FastListingsFUSE.__name__ = FastListingsFUSE.__qualname__ = f"FastListings{fuse_class.__name__}"
    return FastListingsFUSE


def _load_fusepy() -> Binding | None:
    try:
        module = importlib.import_module("fuse")
    except ImportError:
        return None
    except (OSError, AttributeError) as exc:  # fusepy raises EnvironmentError without libfuse2
        raise MountError(f"libfuse2 not usable by fusepy ({exc}): {LIBFUSE2_HINT}") from None
    if not hasattr(module, "FUSE") or not hasattr(module, "fuse_operations"):  # probe: third-party
        return None  # another package named "fuse" (python-fuse), not fusepy
    library = str(getattr(module, "_libfuse_path", "") or "libfuse")  # probe: third-party
    return Binding("fusepy", 2, library, module.FUSE, _FusepyAdapter)


def load_binding(choice: str | None = None) -> Binding:
    """The binding to mount with: ``choice``, else $CKPTFS_FUSE_BINDING, else mfusepy, else fusepy."""
    choice = choice or os.environ.get(BINDING_ENV) or "auto"
    if choice not in BINDINGS + ("auto",):
        raise MountError(f"{BINDING_ENV}={choice!r}: use one of {', '.join(BINDINGS)}", exit_code=2)
    if choice in ("auto", "mfusepy"):
        binding = _load_mfusepy()
        if binding is not None:
            return binding
        if choice == "mfusepy":
            raise MountError("the FUSE binding mfusepy is not installed: pip install mfusepy")
    binding = _load_fusepy()
    if binding is not None:
        return binding
    if choice == "fusepy":
        raise MountError("the FUSE binding fusepy is not installed: pip install fusepy")
    raise MountError("no FUSE binding installed: pip install mfusepy")
