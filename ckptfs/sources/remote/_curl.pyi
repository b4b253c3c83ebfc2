"""One range GET through libcurl with the GIL released (``_curl.c``): what ``ckptfs.sources.remote.curl`` calls."""

from collections.abc import Callable, Sequence

from _typeshed import WriteableBuffer

TAKE: int
DRAIN: int
ABORT: int
E_DEADLINE: int
E_STALL: int
E_LONG: int
E_SHORT: int
E_HEADERS: int
E_TLS_VERIFY: int
E_TLS_CACERT: int

def get(url: str, headers: Sequence[str], want: int, decide: Callable[[int, str, list[tuple[str, str]]], int | tuple[int, int]],
        until: Callable[[], float] | None, deadline: float, stall: float, fresh: bool = False,
        cainfo: str | None = None, capath: str | None = None, proxy: str = "",
        into: WriteableBuffer | None = None, chunk: int = 0, sigv4: str | None = None, user: str | None = None,
        password: str | None = None) -> tuple[int, str, int, list[bytes] | None]: ...
def counters() -> tuple[int, int]: ...
def version() -> str: ...
