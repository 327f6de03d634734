"""Decimal numbers in SIP and SDP text: ASCII digits only (RFC 3261 / RFC 4566 ``DIGIT``).

``str.isdigit()`` also accepts superscripts (``²``) that ``int()`` refuses, and ``int()`` also
accepts what the grammars forbid (``+1``, ``1_0``, Arabic-Indic digits, spaces); every numeric
field of a SIP message or an SDP body goes through :func:`decimal` instead.
"""

from __future__ import annotations

_ASCII_DIGITS = frozenset("0123456789")


def decimal(text: str, max_digits: int = 10) -> int | None:
    """``text`` as a non-negative integer when it is 1 to ``max_digits`` ASCII digits, else
    None (the caller turns None into its protocol error)."""
    if not 0 < len(text) <= max_digits or not _ASCII_DIGITS.issuperset(text):
        return None
    return int(text)
