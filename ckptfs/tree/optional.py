"""Opt-in virtual folders (``hf/``, ``gguf/``): built when the mount is set up, and left out with one log
line when they cannot be, never stopping the mount."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def built_or_logged(folder: str, build: Callable[[], T], expected: type[Exception],
                    log: logging.Logger) -> T | None:
    """``build()``, or None after one line: a warning with the reason for ``expected`` (the folder cannot be
    served: an architecture, a tokenizer), an error naming anything else (a bug, which the optional folder
    must not turn into a failed mount; its traceback at debug level)."""
    try:
        return build()
    except expected as exc:
        log.warning("no %s/ folder: %s", folder, exc)
    except Exception as exc:  # noqa: BLE001 - see above
        log.debug("building %s/ failed", folder, exc_info=True)
        log.error("no %s/ folder: unexpected %s: %s", folder, type(exc).__name__, exc)
    return None
