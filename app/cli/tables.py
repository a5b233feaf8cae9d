"""Tables that never cut an id: what the CLI prints, laid out for the width of the terminal.

A *whole* column (an id, a timestamp, a queue name: anything an operator
copies into the next command) is printed on one line at its full width.
When the table is too wide, the other columns fold; if that is not enough,
the *optional* columns are left out (and the output says which); if even
that is not enough, each row is printed as ``name value`` lines, one field a
line, which fits any terminal wider than an id. ``--json`` prints everything.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from app.cli.output import console

#: a folding column is not made narrower than this to keep a row on one table line
FOLDED_MIN = 8


@dataclass(frozen=True)
class Column:
    header: str
    #: never cut nor wrapped: an id, a timestamp, a name typed into the next command
    whole: bool = False
    #: left out, right to left, when the table would not fit with it
    optional: bool = False


def _cell(value) -> str:
    return "-" if value is None else str(value)


def _fits(columns: list[Column], cells: list[list[str]], width: int) -> bool:
    """Whether a boxed table of these columns fits in ``width`` with every whole column at full width."""
    needed = len(columns) + 1  # the vertical lines of the box
    for index, column in enumerate(columns):
        natural = max([cell_len(column.header), *(cell_len(row[index]) for row in cells)])
        needed += 2 + (natural if column.whole else min(natural, FOLDED_MIN))  # with the padding either side
    return needed <= width


def show(title: str, columns: list[Column], rows: list[list]) -> None:
    """Print ``rows`` under ``title``: a table if one fits, else one ``name value`` block per row."""
    out = console()
    cells = [[_cell(value) for value in row] for row in rows]
    kept = list(range(len(columns)))
    dropped: list[int] = []
    optional = [index for index, column in enumerate(columns) if column.optional]
    while not _fits([columns[i] for i in kept], [[row[i] for i in kept] for row in cells], out.width):
        if not optional:
            out.print(Text(title, style="bold"))
            for row in cells:
                out.print()
                record([(column.header, value) for column, value in zip(columns, row)])
            return
        dropped.insert(0, optional.pop())
        kept.remove(dropped[0])
    table = Table(title=title)
    for index in kept:
        column = columns[index]
        table.add_column(column.header, no_wrap=column.whole, overflow="ignore" if column.whole else "fold")
    for row in cells:
        table.add_row(*(Text(row[index]) for index in kept))
    out.print(table)
    if dropped:
        out.print(Text(f"not shown at this width: {', '.join(columns[i].header for i in dropped)}"
                       " (a wider terminal or --json shows them)", style="dim"))


def record(fields: list[tuple[str, object]]) -> None:
    """One ``name value`` line per field; a value is never wrapped by us, only by the terminal."""
    out = console()
    width = max((cell_len(name) for name, _ in fields), default=0)
    for name, value in fields:
        out.print(Text.assemble((name.ljust(width), "bold"), "  ", _cell(value)), soft_wrap=True)
