"""Id prefixes: the start of an id that an operator may type instead of all of it.

A prefix names at most one thing or it names nothing: it must be at least
:data:`MIN_PREFIX` hex digits, and one that starts several ids is refused
(:class:`~app.errors.AmbiguousId`, naming them) rather than guessed. A UUID prefix is
looked up as a range of the column's own index (``id BETWEEN lo AND hi``),
never by casting every id to text.
"""

from __future__ import annotations

import string
import uuid

from sqlalchemy import select

from app.errors import AmbiguousId

#: the fewest hex digits a prefix may have
MIN_PREFIX = 4
#: how many of the ids an ambiguous prefix starts are named in the error
SHOWN_CANDIDATES = 10

_UUID_SHAPE = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
_HEX = set(string.hexdigits.lower())


def uuid_bounds(typed: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The smallest and the largest UUID that start with ``typed``; ValueError if it is no UUID prefix.

    ``typed`` is a whole UUID in any spelling :class:`uuid.UUID` reads, or
    the start of one with its dashes in place (``afbb4f8a-38b``) or without
    any (``afbb4f8a38b``), at least :data:`MIN_PREFIX` hex digits long.
    """
    try:
        whole = uuid.UUID(typed)
        return whole, whole
    except ValueError:
        pass
    text = typed.strip().lower()
    if "-" in text:
        shaped = len(text) <= len(_UUID_SHAPE) and all(
            (c == "-") if s == "-" else (c in _HEX) for c, s in zip(text, _UUID_SHAPE))
        digits = text.replace("-", "")
    else:
        shaped = len(text) <= 32 and set(text) <= _HEX
        digits = text
    if not shaped:
        raise ValueError(f"{typed!r} is not a UUID nor the start of one")
    if len(digits) < MIN_PREFIX:
        raise ValueError(f"{typed!r} is too short: type at least {MIN_PREFIX} hex digits of the id")
    return uuid.UUID(hex=digits.ljust(32, "0")), uuid.UUID(hex=digits.ljust(32, "f"))


def unique_uuid(conn, column, typed: str, *, what: str) -> uuid.UUID | None:
    """The one value of the UUID ``column`` that is or starts with ``typed``, None if there is none.

    Raises :class:`AmbiguousId` if ``typed`` starts several, ValueError if it
    is no UUID prefix (see :func:`uuid_bounds`).
    """
    low, high = uuid_bounds(typed)
    found = conn.execute(select(column).where(column.between(low, high)).order_by(column)
                         .limit(SHOWN_CANDIDATES + 1)).scalars().all()
    if len(found) > 1:
        raise AmbiguousId(typed, what, [str(f) for f in found[:SHOWN_CANDIDATES]], len(found) > SHOWN_CANDIDATES)
    return found[0] if found else None


def unique_among(typed: str, candidates: list[str], *, what: str) -> str | None:
    """The one of ``candidates`` that is ``typed`` or starts with it, None if there is none.

    An exact match wins; a prefix shorter than :data:`MIN_PREFIX` matches
    only exactly. Raises :class:`AmbiguousId` if ``typed`` starts several.
    """
    if typed in candidates:
        return typed
    if len(typed) < MIN_PREFIX:
        return None
    found = sorted({c for c in candidates if c.startswith(typed)})
    if len(found) > 1:
        raise AmbiguousId(typed, what, found[:SHOWN_CANDIDATES], len(found) > SHOWN_CANDIDATES)
    return found[0] if found else None
