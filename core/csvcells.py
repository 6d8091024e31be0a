"""CSV cells a spreadsheet opens as text, never as a formula (CSV injection).

A cell that starts with `=`, `+`, `-` or `@` (or a tab or carriage return, which some spreadsheets
skip before they look) runs as a formula when the file is opened: a `=HYPERLINK(…)` in a KB answer
or in a rule's name would act for whoever opens the export. Every CSV this project writes passes
its cells through `csv_cell`, which puts an apostrophe in front of such a cell, the mark
spreadsheets take for "text". A cell that already starts with an apostrophe gets one more, so
`csv_cell_read` gives back exactly what was written: our exports import again unchanged.
"""

from __future__ import annotations

_QUOTE = "'"
_ESCAPED = ("=", "+", "-", "@", "\t", "\r", _QUOTE)


def csv_cell(value):
    """`value` as it may go into a CSV cell; anything but text passes unchanged."""
    if isinstance(value, str) and value.startswith(_ESCAPED):
        return _QUOTE + value
    return value


def csv_cell_read(text: str | None) -> str | None:
    """The value `csv_cell` wrote as `text`."""
    if text is not None and text.startswith(_QUOTE) and text[1:].startswith(_ESCAPED):
        return text[1:]
    return text
