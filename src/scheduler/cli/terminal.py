"""Text for the operator's terminal (OPS-25).

Senders and operators write the text the CLI prints (``user_id``, ``event_type``, facts,
titles, ``last_error``, actors, reasons); ingest refuses only NUL. Printed raw, an ESC
sequence would drive the terminal, a carriage return or newline would forge a line, a
bidi override would reorder it. ``terminal_safe`` shows such characters as visible escapes
and leaves every other character, non-ASCII text included, as it is. (``--json`` needs
none of this: ``json.dumps`` escapes them itself.)
"""

from __future__ import annotations

import unicodedata

# Cc: C0 and C1 controls and DEL (\n, \r, \t, ESC, CSI ...); Cf: format characters, the
# bidi overrides and isolates, zero-width characters; Cs: surrogates; Zl, Zp: the line and
# paragraph separators.
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def terminal_safe(value: object) -> str:
    """``str(value)`` for one line of a terminal: control, format and line-separator
    characters as escapes (``\\x1b``, ``\\n``, ``\\u202e``), every other character as is."""
    text = str(value)
    if text.isprintable():  # no Cc, Cf, Cs, Zl or Zp (nor a few harmless ones): the usual case
        return text
    return "".join(_escape(c) if unicodedata.category(c) in ESCAPED_CATEGORIES else c for c in text)
