"""An id argument that also takes a unique prefix of the id (:mod:`app.core.id_prefixes`)."""

from __future__ import annotations

import click

from app.core import id_prefixes


class UuidPrefix(click.ParamType):
    """A UUID, or at least ``id_prefixes.MIN_PREFIX`` hex digits of its start; resolved by the command."""

    name = "id-or-prefix"

    def convert(self, value, param, ctx) -> str:
        try:
            id_prefixes.uuid_bounds(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return value.strip()


UUID_PREFIX = UuidPrefix()
