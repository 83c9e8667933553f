"""Whole numbers from text a stranger wrote: ASCII digits only, of bounded length.

The one primitive under every number the service reads from a URL, a header, a form or a
command line (``scheduler.web.http.params`` builds the query parameters on it; the application
layer's query model and the CLI use it directly). ``str.isdigit()`` is not enough: it
accepts ``²`` and ``٣``, which ``int()`` then refuses (a 500 once), and ``int()`` alone
accepts signs, spaces and ``_``. The length is checked before ``int()``, so a megabyte of
digits costs nothing (decision DEC-PARAMS).
"""

from __future__ import annotations

ASCII_DIGITS = frozenset("0123456789")


def digits_value(raw: str, max_digits: int) -> int | None:
    """``raw`` as a whole number if it is 1 to ``max_digits`` ASCII digits; else None."""
    if not raw or len(raw) > max_digits or not ASCII_DIGITS.issuperset(raw):
        return None
    return int(raw)


__all__ = ["ASCII_DIGITS", "digits_value"]
