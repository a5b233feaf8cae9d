"""What every command needs: the settings, the services, the operator's name, and failures as an exit status."""

from __future__ import annotations

import functools
import getpass
import re

import click
from sqlalchemy.exc import InterfaceError, OperationalError

from app.config import Settings
from app.errors import AttacheError, ConfigError


def settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise click.ClickException(f"configuration error: {exc}")


def services():
    from app.services import Services

    return Services(settings(), pool_size=2, process="cli")


def operator() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli:unknown"


#: a value that reads as an option's name: dashes, or a dash a document or a chat put in their place, then a letter
_OPTION_LIKE = re.compile(r"[-\u2010-\u2015\u2212]+[A-Za-z]")


def _a_reason(_ctx, _param, values: tuple[str, ...]) -> str | None:
    """One ``--reason``, not an option's name: `--reason --dry-run` took the flag for the reason, and the backfill ran;
    given twice, the last one was taken and the refusal of the first never seen (re-attacks)."""
    if len(values) > 1:
        raise click.BadParameter("given more than once; nothing was done")
    for value in values:
        if _OPTION_LIKE.match(value):
            raise click.BadParameter(f"{value!r} is an option, not a reason; nothing was done")
    return values[0] if values else None


def reason_option(help: str, *, required: bool = False):
    """``--reason``, the audited why of an operator's action, once; a value that is an option's name is refused."""
    return click.option("--reason", required=required, multiple=True, callback=_a_reason, help=help)


def fail_on_attache_errors(fn):
    """An attache error or a ValueError ends the command with its message and exit status 1; so does a connection
    to PostgreSQL lost or never made outside a :func:`~app.adapters.postgres.db.transaction` (the cleanups' locks:
    ``attache gc run`` printed a traceback with the database down, an adversarial run)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (AttacheError, ValueError) as exc:
            raise click.ClickException(str(exc))
        except (OperationalError, InterfaceError) as exc:
            reason = (str(exc.orig) if exc.orig is not None else str(exc)).strip().splitlines()
            raise click.ClickException(f"database unavailable: {reason[0][:300] if reason else type(exc).__name__}")

    return wrapper
