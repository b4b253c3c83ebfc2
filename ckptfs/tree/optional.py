"""Opt-in virtual folders (``hf/``, ``gguf/``): built when the mount is set up.

A folder that cannot be built is one line either way. When it was asked of a single checkpoint
(``required``), the mount fails with that line (a ``CheckpointError``): the command said to serve the
view, and a mount without it would look like success. A member of a repository that cannot have it is
served without it, and the line is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from ckptfs.core.errors import CheckpointError

T = TypeVar("T")


def refused(folder: str, reason: str, src: object, required: bool, log: logging.Logger) -> None:
    """The one line for a folder not built: raised for a ``required`` one, logged (a warning) otherwise."""
    if required:
        raise CheckpointError(str(src), None, f"no {folder}/ folder: {reason}")
    log.warning("no %s/ folder: %s", folder, reason)


def build_or_reason(build: Callable[[], T], expected: type[Exception],
                    log: logging.Logger) -> tuple[T | None, str | None, bool]:
    """(``build()``, None, True), or (None, why not, whether that was ``expected``): the check both the mount
    and ``ckptfs info`` run. ``expected`` is a folder that cannot be served (an architecture, a tokenizer);
    anything else is a bug, named "unexpected" (its traceback at debug level)."""
    try:
        return build(), None, True
    except expected as exc:
        return None, str(exc), True
    except Exception as exc:  # see above
        log.debug("building the folder failed", exc_info=True)
        return None, f"unexpected {type(exc).__name__}: {exc}", False


def built_or_logged(folder: str, build: Callable[[], T], expected: type[Exception],
                    log: logging.Logger, src: object = None, required: bool = False) -> T | None:
    """``build()``, or None after one line (``build_or_reason``): a warning for ``expected``, an error for
    anything else, which the optional folder must not turn into a failed mount of a repository.
    ``required``: the line is raised instead (see the module docstring)."""
    value, reason, expected_failure = build_or_reason(build, expected, log)
    if reason is None:
        return value
    if required or expected_failure:
        refused(folder, reason, src, required, log)
    else:
        log.error("no %s/ folder: %s", folder, reason)
    return None
