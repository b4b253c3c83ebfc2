"""One line of human-readable text, whatever the names in it hold.

Tensor names, metadata keys and values, and file paths come from the checkpoint or the user and may hold
newlines or other control characters (a multi-line ``tokenizer.chat_template``, a crafted tensor name). Every
line meant for a person (``ckptfs info``, error messages, the daemon's one-line log entries) passes through
``one_line`` so that such a name is shown escaped (``\\n``, ``\\t``, ``\\x1b``, ``\\u2028``) instead of
splitting the line or sending terminal escapes. Lone surrogates (undecodable bytes of a name) are escaped too,
so printing never fails on a UTF-8 terminal. Machine output (``--json``) is left alone: JSON escapes by itself.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(code: int) -> str:
    char = chr(code)
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_CONTROLS = [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029, *range(0xD800, 0xE000)]
_TABLE = {code: _escape(code) for code in _CONTROLS}


def one_line(text: object) -> str:
    """``str(text)`` with every control character, line separator and lone surrogate escaped."""
    return str(text).translate(_TABLE)
