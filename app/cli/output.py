"""Where a command's output goes: the console of this invocation, and ``--json`` instead of a table."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.text import Text

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def console() -> Console:
    """The console of the running command, as wide as the terminal (or ``COLUMNS``) when it started."""
    meta = click.get_current_context().meta
    if "attache.console" not in meta:
        meta["attache.console"] = Console()
    return meta["attache.console"]


def emit(data, as_json: bool, render) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        render(data)


def say(line: str) -> None:
    """Print one line as it is: no markup, and wrapped only by the terminal, so an id in it stays whole."""
    console().print(Text(line), soft_wrap=True)
