"""What every command needs: the settings, the services, the operator's name, and failures as an exit status."""

from __future__ import annotations

import functools
import getpass

import click

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


def fail_on_attache_errors(fn):
    """An attache error or a ValueError ends the command with its message and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (AttacheError, ValueError) as exc:
            raise click.ClickException(str(exc))

    return wrapper
