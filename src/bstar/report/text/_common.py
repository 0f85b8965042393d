"""What the terminal renderers share: the consoles, ANSI styles for plain text, B* as it is
printed, plain-text columns and a rich table that fits the terminal. Standard library only
at import; rich loads inside the functions that draw with it."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

Styler = Callable[[str, str], str]

# Untrusted text (a server's model id, a name or path from a file, a stored run's fields):
# C0/C1 control characters (ESC starts ANSI and OSC sequences: colours, titles, hyperlinks),
# DEL and the bidirectional overrides that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
NAME_CHARS = 120  # a name printed in a line or a table cell


def _visible(m: re.Match[str]) -> str:
    ch = m.group()
    if ch in "\t\n\r":
        return " "
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def clean_text(value: object, limit: int = NAME_CHARS) -> str:
    """`value` as text that is safe to print or draw: one line, each control character
    shown as an escape (`\\x1b`) instead of acting on the terminal, and at most `limit`
    characters, a longer one cut with the count of the rest (a 100 kB model id took `runs
    show` 40 s to lay out). Rich markup is not escaped here: see `markup_text`."""
    s = str(value)
    # Only the head can be shown: cleaning a bounded slice keeps a huge value cheap.
    head = _CONTROL.sub(_visible, s[:limit + 1])
    if len(s) > limit or len(head) > limit:
        rest = len(s) - limit
        head = head[:limit] + (f"… (+{rest:,} characters)" if rest > 0 else "…")
    return head


def markup_text(value: object, limit: int = NAME_CHARS) -> str:
    """`clean_text` escaped for rich markup: a `[/]` or `[link=...]` in a server's model id
    prints as itself, never as a style, a hyperlink or a MarkupError."""
    from rich.markup import escape

    return escape(clean_text(value, limit))


def console() -> Console:
    """A rich console on stdout; piped output would wrap at rich's 80-column default and
    break tables, so it is 200 wide there."""
    from rich.console import Console

    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=False, width=width)


def wide_console(**kw: Any) -> Console:
    """A console that does not squeeze the level table into 80 columns when piped."""
    from rich.console import Console

    stream = kw.get("file") or (sys.stderr if kw.get("stderr") else sys.stdout)
    if not stream.isatty():
        kw.setdefault("width", 200)
    return Console(**kw)


def ansi_styler(stream: Any) -> Styler:
    """`style(text, name)`: ANSI styles for a terminal (none when piped or NO_COLOR is set)."""
    on = bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ
    codes = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33",
             "magenta": "35", "bold green": "1;32", "bold red": "1;31"}

    def style(text: str, name: str) -> str:
        return f"\x1b[{codes[name]}m{text}\x1b[0m" if on and name in codes else text
    return style


# A terminal table shows its first and last rows and says how many it left out; --json (or
# `runs export`) has every row. Printing 20,000 rows took 90% of an 11 s `bstar fit`.
TABLE_HEAD_ROWS = 20
TABLE_TAIL_ROWS = 10


def elided(n: int, head: int = TABLE_HEAD_ROWS, tail: int = TABLE_TAIL_ROWS
           ) -> list[int | None]:
    """The row indices a terminal table shows of `n` rows: all of them when few, else the
    first `head`, None where the rest were left out, and the last `tail`."""
    if n <= head + tail + 1:
        return list(range(n))
    return [*range(head), None, *range(n - tail, n)]


def gap_row(n: int, head: int = TABLE_HEAD_ROWS, tail: int = TABLE_TAIL_ROWS,
            where: str = "--json") -> str:
    """The text of the row that stands for the rows `elided` left out."""
    return f"... {n - head - tail:,} more rows ({where} has all {n:,})"


def fmt_b_star(b: float) -> str:
    """B* with two decimals wherever it is printed beside a batch (14.96, not 15.0)."""
    return f"{b:.2f}"


def plain_columns(headers: list[tuple[str, str]], rows: list[list[tuple[str, str]]],
                  right: list[bool], indent: str = "  ") -> list[str]:
    """Plain-text columns: two header lines, cells (text, style name) never cut."""
    widths = [max(len(h[0]), len(h[1]), *(len(r[i][0]) for r in rows))
              for i, h in enumerate(headers)]

    def cell(text: str, i: int) -> str:
        return text.rjust(widths[i]) if right[i] else text.ljust(widths[i])

    out = [indent + "  ".join(cell(h[k], i) for i, h in enumerate(headers)).rstrip()
           for k in (0, 1)]
    for r in rows:
        out.append(indent + "  ".join(cell(t, i) for i, (t, _) in enumerate(r)).rstrip())
    return out


def rich_table(**kw: Any) -> Table:
    """A rich Table (rich imported here, not where the renderer module is imported)."""
    from rich.table import Table

    return Table(**kw)


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a catalog table: `keep` columns (ids, numbers) are never cut or wrapped;
    the others wrap, and columns with a `drop` rank leave (lowest rank first) when the
    table does not fit the terminal."""

    name: str
    right: bool = False
    keep: bool = True
    drop: int | None = None


def table_to_width(c: Console, cols: list[Column], rows: list[list[str]], **kw: Any) -> Table:
    """A rich table that fits `c.width` without cutting a `keep` cell: wrap the rest, and
    leave out droppable columns while the narrowest layout is still too wide."""
    from rich.text import Text

    def plain(cell: str) -> str:
        return Text.from_markup(cell).plain

    mins = []
    for i, col in enumerate(cols):
        cells = [plain(r[i]) for r in rows]
        head = max(len(w) for w in col.name.split("\n"))
        if col.keep:
            mins.append(max([head, *(len(x) for x in cells)]))
        else:  # wraps at spaces: its longest word
            mins.append(max([head, 1, *(len(w) for x in cells for w in x.split())]))
    shown = list(range(len(cols)))
    # Heavy box with edges: a bar before each column and one after, padding 1 each side.
    while sum(mins[i] + 3 for i in shown) + 1 > c.width:
        droppable = [i for i in shown if cols[i].drop is not None]
        if not droppable:
            break
        shown.remove(min(droppable, key=lambda i: cols[i].drop or 0))
    t = rich_table(**kw)
    for i in shown:
        col = cols[i]
        t.add_column(col.name, justify="right" if col.right else "left", no_wrap=col.keep,
                     min_width=mins[i] if col.keep else None, overflow="fold")
    for r in rows:
        t.add_row(*(r[i] for i in shown))
    return t
