"""Find an upload from whatever an operator has: the one search behind the console's box, ``attache find``
and ``GET /v1/ops/search``.

What is typed is tried as each of these at once, and every attachment that
any of them finds is a match (with how it matched):

* an attachment id or a job id, whole or a unique start of it (at least
  :data:`~app.core.id_prefixes.MIN_PREFIX` hex digits, dashes optional:
  :func:`app.core.id_prefixes.uuid_bounds`, a range of the primary key);
* a sha256, whole or its first :data:`MIN_SHA256_PREFIX` hex digits or more
  (``attachments_sha256_idx``, ``text_pattern_ops``, so ``LIKE 'abc%'`` is a
  range scan);
* an uploader, exactly (``attachments_owner_idx``);
* a fragment of the filename, :data:`MIN_FRAGMENT` characters or more, at
  least :data:`MIN_FRAGMENT` of them letters or digits, case-insensitive
  (``attachments_filename_trgm_idx``, a ``pg_trgm`` GIN index; what a
  fragment of common trigrams costs: :func:`_by_filename`).

Matches come newest first, at most ``limit`` of them (``more`` says there
were others). The queries run under a :data:`TIME_LIMIT_SECONDS` limit on
them all (:func:`~app.adapters.postgres.db.time_limit`); a search that
cannot finish in it is :class:`SearchTooBroad`.
"""

from __future__ import annotations

import re
import uuid

from sqlalchemy import null, select
from sqlalchemy.engine import Engine

from app.adapters.postgres.db import time_limit, transaction
from app.adapters.postgres.models import attachments, jobs
from app.core import id_prefixes
from app.errors import QueryTimeout, SearchTooBroad

#: the most matches a search returns
MAX_MATCHES = 50
#: the shortest filename fragment searched for, and the fewest letters or digits it holds
MIN_FRAGMENT = 3
#: the fewest hex digits of a sha256 searched for as its start
MIN_SHA256_PREFIX = 8
#: the longest text searched for
MAX_QUERY = 256
#: how long the search's queries may take together (``time_limit`` bounds the block, not each statement)
TIME_LIMIT_SECONDS = 5.0

_HEX = re.compile(r"[0-9a-fA-F]+")
_NO_JOB = null().label("job_id")

#: how a match was found, in the order they are listed
ATTACHMENT_ID, JOB_ID, SHA256, UPLOADER, FILENAME = "attachment id", "job id", "sha256", "uploader", "filename"


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _searches(text: str, limit: int) -> list[tuple[str, object]]:
    """``(how, query)`` for every reading of ``text``; each query selects ``(attachment_id, job_id or None)``."""
    newest = attachments.c.created_at.desc()
    found: list[tuple[str, object]] = []
    try:
        low, high = id_prefixes.uuid_bounds(text)
    except ValueError:
        pass
    else:
        found.append((ATTACHMENT_ID, select(attachments.c.id, _NO_JOB).where(attachments.c.id.between(low, high))
                      .order_by(attachments.c.id).limit(limit + 1)))
        found.append((JOB_ID, select(jobs.c.attachment_id, jobs.c.id).where(jobs.c.id.between(low, high))
                      .order_by(jobs.c.id).limit(limit + 1)))
    if _HEX.fullmatch(text) and MIN_SHA256_PREFIX <= len(text) <= 64:
        digest = text.lower()
        condition = attachments.c.sha256 == digest if len(digest) == 64 else \
            attachments.c.sha256.like(_like_escaped(digest) + "%")
        found.append((SHA256, select(attachments.c.id, _NO_JOB).where(condition).order_by(newest).limit(limit + 1)))
    found.append((UPLOADER, select(attachments.c.id, _NO_JOB).where(attachments.c.owner == text)
                  .order_by(newest).limit(limit + 1)))
    if len(text) >= MIN_FRAGMENT:
        found.append((FILENAME, _by_filename(text, limit)))
    return found


def _by_filename(text: str, limit: int):
    """The newest ``limit`` + 1 attachments whose filename holds ``text``, on the trigram index.

    The index finds the rows that hold each of the fragment's trigrams, and
    PostgreSQL rechecks them: a fragment whose trigrams are each common but
    never together (``jpg.IMG``) has every such row rechecked (200,000 rows,
    100-125 ms, growing with the table; an adversarial review), bounded by
    :data:`TIME_LIMIT_SECONDS` on the whole search (then
    :class:`SearchTooBroad`) and by the reads one client may have in flight.
    Looking among the newest attachments only would bound it better, and
    lose every older upload's name. A fragment with too few letters or
    digits (``...``, no trigram to look up: a read of every row) is refused
    (:func:`_check_fragment`).
    """
    return (select(attachments.c.id, _NO_JOB)
            .where(attachments.c.filename.ilike(f"%{_like_escaped(text)}%", escape="\\"))
            .order_by(attachments.c.created_at.desc()).limit(limit + 1))


def _check_fragment(text: str) -> None:
    """ValueError for a text long enough to be searched as a filename fragment with too few letters or digits in
    it: ``...`` or ``___`` is in nearly every filename or in none, and tells no upload from another."""
    # letters of any script and decimal digits: pg_trgm makes no trigram of "²³¹" or "½½½", which str.isalnum()
    # counts (numbers, not digits), and such a part was a read of every row again (a re-attack)
    if len(text) >= MIN_FRAGMENT and sum(ch.isalpha() or ch.isdecimal() for ch in text) < MIN_FRAGMENT:
        raise ValueError(f"a part of a filename needs at least {MIN_FRAGMENT} letters or digits: type more of it "
                         "(or an id, a sha256 or an uploader)")


def _iso(value):
    return value.isoformat() if value is not None else None


def search(engine: Engine, text: str, *, limit: int = MAX_MATCHES) -> dict:
    """``{"query", "matches": [...], "more"}``: the attachments ``text`` names, newest first.

    Each match is the attachment (id, filename, uploader, size, sha256,
    created_at), ``matched_by`` (how it was found), ``matched_job_ids`` (the
    jobs whose id matched) and ``jobs`` (every pipeline version's job, id and
    state). ValueError for an empty or overlong text; :class:`SearchTooBroad`
    when the queries take longer than :data:`TIME_LIMIT_SECONDS`.
    """
    text = (text or "").strip()
    if not text:
        raise ValueError("type an attachment or job id (or its start), a sha256, an uploader or part of a filename")
    if len(text) > MAX_QUERY:
        raise ValueError(f"a search is at most {MAX_QUERY} characters")
    if not text.isprintable():
        raise ValueError("a search is printable text, without control characters")
    _check_fragment(text)
    limit = max(1, min(limit, MAX_MATCHES))
    how: dict[uuid.UUID, list[str]] = {}
    job_hits: dict[uuid.UUID, list[str]] = {}
    more = False
    try:
        with transaction(engine) as conn, time_limit(conn, TIME_LIMIT_SECONDS):
            for kind, query in _searches(text, limit):
                rows = conn.execute(query).all()
                more |= len(rows) > limit
                for attachment_id, job_id in rows[:limit]:
                    if kind not in how.setdefault(attachment_id, []):
                        how[attachment_id].append(kind)
                    if job_id is not None:
                        job_hits.setdefault(attachment_id, []).append(str(job_id))
            found = conn.execute(select(attachments).where(attachments.c.id.in_(list(how)))).all() if how else []
            versions = conn.execute(select(jobs.c.attachment_id, jobs.c.id, jobs.c.pipeline_version, jobs.c.state,
                                           jobs.c.error_code)
                                    .where(jobs.c.attachment_id.in_(list(how)))
                                    .order_by(jobs.c.pipeline_version)).all() if how else []
    except QueryTimeout:
        raise SearchTooBroad(f"searching for {text!r} took longer than {TIME_LIMIT_SECONDS:g} s: type more of it "
                             "(a longer part of the filename, more of the id)") from None
    by_attachment: dict[uuid.UUID, list[dict]] = {}
    for row in versions:
        by_attachment.setdefault(row.attachment_id, []).append({
            "job_id": str(row.id), "pipeline_version": row.pipeline_version, "state": row.state,
            "error_code": row.error_code})
    # an id match first (it names one thing), then newest first
    found.sort(key=lambda a: (not ({ATTACHMENT_ID, JOB_ID} & set(how[a.id])), -a.created_at.timestamp()))
    more |= len(found) > limit
    matches = [{
        "attachment_id": str(a.id), "filename": a.filename, "uploader": a.owner, "size": a.size,
        "content_type": a.content_type, "sha256": a.sha256, "created_at": _iso(a.created_at),
        "matched_by": how[a.id], "matched_job_ids": job_hits.get(a.id, []), "jobs": by_attachment.get(a.id, []),
    } for a in found[:limit]]
    return {"query": text, "matches": matches, "more": more}


def landing(result: dict) -> dict | None:
    """The one match to go straight to, or None when the search found none or several."""
    return result["matches"][0] if len(result["matches"]) == 1 and not result["more"] else None
