"""``attache dev-token``: the development token, for a laptop without ``ATTACHE_API_TOKENS``."""

from __future__ import annotations

import click

from app.cli.output import say
from app.cli.runtime import settings


@click.command("dev-token")
def dev_token() -> None:
    """Create (once) and print the development token, with a ready-to-paste curl line."""
    from app.core.auth import dev_token as make

    current = settings()
    if current.api_tokens:
        say("ATTACHE_API_TOKENS is set: no development token is used")
        return
    token = make().secret
    click.echo(f"development token (operator 'dev'): {token}")
    click.echo(f"  curl -H 'Authorization: Bearer {token}' -F file=@photo.jpg http://127.0.0.1:{current.port}/v1/attachments")
