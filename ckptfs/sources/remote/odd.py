"""Odd answers: an answer that cannot be the bytes asked for is not believed at once.

One backend behind a load balancer, or a proxy, may answer wrongly while the origin is not wrong: a 200
with the whole file to a Range request, another range or total in ``Content-Range``, another validator
(HTTP's ``ETag``/``Last-Modified``, S3's ``ETag`` or its refused ``If-Match``), a 416. Such an answer's
body is dropped unread and the range asked again at once on a fresh connection (by the retry rule,
``origin.Attempts``); only a second answer wrong the same way decides (the file was replaced, or the server
cannot serve ranges), and two different wrong answers are retried like a reset, within the read's deadline
(``origin.asked_again``). The odd answer's bytes
are never served, nor mixed with the second answer's.
"""

from __future__ import annotations

import re

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


def content_range(value: str | None) -> tuple[int, int, int | None] | None:
    """``(first, last, total)`` of a ``Content-Range: bytes FIRST-LAST/TOTAL`` (total None for ``*``), or None
    when there is none or it cannot be read (an answer that is not a range)."""
    match = _CONTENT_RANGE.match(value or "")
    if not match:
        return None
    return int(match[1]), int(match[2]), None if match[3] == "*" else int(match[3])


class OddAnswer(Exception):
    """An answer that cannot be the bytes asked for: ``signature`` tells two wrong answers apart; ``final``
    is the error once a second answer is wrong the same way."""

    def __init__(self, signature: tuple[object, ...], final: Exception):
        super().__init__(str(final))
        self.signature = signature
        self.final = final
