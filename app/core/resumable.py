"""Resumable uploads (the tus protocol's server side, without its HTTP): partial bytes, their state, their end.

An upload is a row in ``uploads`` (owner, ``Upload-Length``, how far it
has got, its ``Upload-Metadata``, when it expires) and the bytes received
so far, one storage object per accepted PATCH:
``partial/{upload_id}/{offset}.{token}`` (the offset zero-padded to 20
digits, the token the PATCH's own), named by a row of ``upload_parts`` in
the transaction that moves the upload's offset. Every backend stores parts
the same way: each part is written atomically like any other object, so a
process killed mid-PATCH never leaves half an append behind (a filesystem
append would, and S3 cannot append at all), and the offset in the row
moves only after its part is stored.

* **Append.** A PATCH's body is received first, then the row is locked
  (``SELECT … FOR UPDATE``), its offset compared with the PATCH's, the part
  stored under a key of its own, named in ``upload_parts`` and the offset
  advanced, in that transaction. Two PATCHes at the same offset therefore
  never both append: the second finds the offset moved and gets ``409``.
  Only the parts ``upload_parts`` names are ever joined: a PATCH whose
  session ended while it stored its part (a frozen machine, a failover: the
  row's lock went with the session, and another PATCH took the offset and
  was answered ``204``) stores it under its own key, which no committed row
  names, so it can neither replace the acknowledged part nor be joined (an
  adversarial run: when parts were keyed by their offset alone, the thawed
  PATCH's bytes replaced the acknowledged part, and the upload was accepted
  spliced). A part no committed row names is removed by its PATCH when its
  transaction clearly rolled back, else with the upload, or by the staging
  cleanup once the offset has passed it. Uploads created before migration
  0024 (bytes and no ``upload_parts`` rows) keep parts keyed by their offset
  alone, as they were written.
* **The last byte.** Under the same lock the parts are concatenated into a
  local spool, which goes through the durable handoff of ``POST
  /v1/attachments`` (:func:`app.core.intake.stage`: probed, staged;
  :func:`app.core.intake.record`: attachment, job and outbox row) in the
  PATCH's own transaction, with the row's ``attachment_id``: the upload is
  complete, with its attachment, or nothing of the last PATCH is. A last
  PATCH whose session ended while it joined (its lock gone, another PATCH
  since answered ``204`` at its offset) commits nothing: when the handoff
  committed in a transaction of its own, such a PATCH made an attachment of
  bytes that ``204`` had contradicted (an adversarial run). The
  Idempotency-Key ``tus:{upload_id}`` is still claimed: an upload whose
  handoff an earlier release committed apart from its row is settled with
  that attachment, not given a second. Then the parts are removed. An upload
  whose bytes are refused (not an image attache processes, a bomb…) is
  terminated with the refusal.
* **The first bytes.** A first part that holds the upload's first
  ``SNIFF_BYTES`` (64) is checked for an accepted image format's magic
  bytes before it is stored: something else is refused (``415
  unsupported_format``) and the upload terminated at once, not after its
  last byte was sent.
* **Expiry.** An upload expires ``ATTACHE_UPLOAD_EXPIRY_SECONDS`` after its
  last PATCH (never later than the Idempotency-Key lifetime, so the retry
  above always finds its key). The staging cleanup forgets expired uploads
  with their parts (:func:`forget_expired`) and removes parts nobody needs
  any more (:func:`part_removable`). Parts are never an attachment: nothing
  reads ``partial/`` but this module.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Callable, NamedTuple

from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from app.adapters import imaging
from app.adapters.postgres.db import kept_alive, lock_not_available, transaction
from app.adapters.postgres.models import upload_parts, uploads
from app.adapters.storage import ObjectInfo, Storage
from app.core import intake, pending, pipeline, room
from app.errors import (
    AttacheError,
    DatabaseUnavailable,
    DigestMismatch,
    IdempotencyKeyReused,
    OffsetMismatch,
    PartsMissing,
    PermanentError,
    TooManyOpenUploads,
    TooManyParts,
    UploadExpired,
    UploadLocked,
    UploadNotFound,
    UploadRejected,
    UploadTooLarge,
)

log = logging.getLogger("attache.resumable")

#: where partial bytes live in storage
PREFIX = "partial/"
COPY_CHUNK = 1024 * 1024


def parts_prefix(upload_id: uuid.UUID) -> str:
    return f"{PREFIX}{upload_id}/"


def part_key(upload_id: uuid.UUID, offset: int, token: str | None = None) -> str:
    """Where a part lies: by its offset and its PATCH's token (without a token: an upload from before 0024)."""
    return f"{parts_prefix(upload_id)}{offset:020d}" + (f".{token}" if token is not None else "")


def _part_name(key: str) -> tuple[uuid.UUID, int, str | None] | None:
    """The upload, offset and token of a part's key; None for a key :func:`part_key` never makes."""
    upload_id, _, name = key[len(PREFIX):].partition("/")
    offset, dot, token = name.partition(".")
    try:
        return uuid.UUID(upload_id), int(offset), (token if dot else None)
    except ValueError:
        return None


#: the Idempotency-Keys of resumable uploads' hand-offs; a client's key may not begin with it
HANDOFF_KEY_PREFIX = "tus:"


def handoff_key(upload_id: uuid.UUID) -> str:
    """The Idempotency-Key under which the upload's last byte makes its attachment."""
    return f"{HANDOFF_KEY_PREFIX}{upload_id}"


def lifetime(settings) -> timedelta:
    """How long an upload lives after its last PATCH (see the module docstring)."""
    return timedelta(seconds=min(settings.upload_expiry_seconds, settings.idempotency_ttl_seconds))


@dataclass(frozen=True)
class Upload:
    id: uuid.UUID
    owner: str
    length: int
    offset: int
    metadata: str | None
    filename: str
    attachment_id: uuid.UUID | None
    expires_at: datetime
    #: the whole upload's SHA-256 (hex) its creation's ``Repr-Digest`` promised, or None
    expected_sha256: str | None = None

    @property
    def complete(self) -> bool:
        """Its last byte went through the durable handoff: ``attachment_id`` names what it made."""
        return self.attachment_id is not None

    @classmethod
    def of(cls, row) -> "Upload":
        return cls(row.id, row.owner, row.upload_length, row.upload_offset, row.upload_metadata, row.filename,
                   row.attachment_id, row.expires_at, row.expected_sha256)


class Created(NamedTuple):
    """What :func:`create` answers: the upload, and whether it was made by an earlier creation with the same key."""

    upload: Upload
    replayed: bool


def create(services, *, owner: str, length: int, filename: str, metadata: str | None,
           expected_sha256: str | None = None, key: str | None = None) -> Created:
    """A new, empty upload of ``length`` bytes; the upload limit is checked here, before any byte is sent.

    ``expected_sha256`` (hex): what the joined bytes must hash to at the last byte, else the upload is refused.
    ``key``: the creation's Idempotency-Key. While an upload the uploader created with it is there (open, or
    finished), the creation answers that one (:class:`IdempotencyKeyReused` if it declared another length, digest
    or ``Upload-Metadata``): tus-js-client sends a creation whose answer was lost again, and each made an upload
    that stayed open, empty, for a day, counted against the uploader's limits until every creation was refused
    (an adversarial run). An expired upload gives its key up; one being written when it would gives it up to no
    creation (:func:`_give_up`).

    A replay never waits for the upload's row: a PATCH or a DELETE may hold it (a last PATCH joining 43 MB of parts
    on slow storage), and a replay waiting for it held the uploader's creations behind it, and took the pool's
    connections, until its lock timeout (a re-attack); what it answers is where the upload stood when it was read.
    """
    limit = services.settings.max_upload_bytes
    if length > limit:
        raise UploadTooLarge(f"Upload-Length {length} is larger than the limit of {limit} bytes")
    if length < 1:
        raise UploadRejected("the upload is empty", error_code="empty_body")
    with transaction(services.engine) as conn:
        if key is not None:
            _lock_creations(conn, owner)  # a key sent twice at once
            # read, not locked (see above): a replay never waits for the upload's row
            earlier = conn.execute(select(uploads).where(uploads.c.owner == owner, uploads.c.creation_key == key)
                                   ).one_or_none()
            if earlier is not None and earlier.attachment_id is None and earlier.expires_at <= _now(conn):
                earlier = _give_up(conn, earlier, key)  # None: the unique key is free for the new upload
            if earlier is not None:
                if (earlier.upload_length, earlier.expected_sha256, earlier.upload_metadata) != (
                        length, expected_sha256, metadata):  # another name answered with the first one's upload
                    raise IdempotencyKeyReused("this Idempotency-Key made an upload of another length, digest or "
                                               "Upload-Metadata")
                return Created(Upload.of(earlier), True)
        pending.admit(conn, owner, services.settings.max_pending_per_uploader)  # 429: no upload is made
        _admit_open(conn, services.settings, owner, length)
        row = conn.execute(insert(uploads).values(
            id=uuid.uuid4(), owner=owner, upload_length=length, upload_metadata=metadata, filename=filename,
            expected_sha256=expected_sha256, creation_key=key,
            expires_at=_now(conn) + lifetime(services.settings)).returning(uploads)).one()
    return Created(Upload.of(row), False)


def _give_up(conn, earlier, key: str):
    """Free ``key`` from the upload ``earlier``, read unfinished and expired, and answer None; or answer the upload's
    row, for a replay, when it is not (or may not be) given up after all.

    The read that judged it is not locked (a replay never waits for the row), so the row is locked here, ``NOWAIT``,
    and judged again as it stands now. Locked by another request, it is being written: a PATCH begun before it
    expired (which extends its life, or finishes it), a DELETE; the creation is a replay of the upload as it was
    read, and the key stays with it (a creation sent after that request ends judges it again). The key was freed by
    an ``UPDATE`` that waited for the row, then matched it by its key alone: the last PATCH of a 43 MB upload,
    begun just before its expiry, finished it (``204``, its Attachment-Id) while the creation sent again waited,
    then the finished upload lost its key and the creation was answered a new, empty upload, not a replay; a client
    whose creation's answer was lost would have sent the file again and made a second attachment (an adversarial
    run). Gone since the read (terminated, forgotten): the key is free."""
    try:
        with conn.begin_nested():  # a lock not taken ends the savepoint, not the creation's transaction
            current = conn.execute(select(uploads).where(uploads.c.id == earlier.id, uploads.c.creation_key == key)
                                   .with_for_update(nowait=True)).one_or_none()
    except OperationalError as exc:
        if lock_not_available(exc):
            return earlier
        raise
    if current is None:
        return None
    if current.attachment_id is not None or current.expires_at > _now(conn):  # finished, or extended, since the read
        return current
    conn.execute(update(uploads).where(uploads.c.id == current.id).values(creation_key=None))
    return None


#: the first key of the two-key advisory locks of one uploader's creations (a key space of its own, as
#: :data:`app.core.staging.NAMESPACE` and :data:`app.core.objects.NAMESPACE` are)
NAMESPACE = 727277

_LOCK_CREATIONS = text("SELECT pg_advisory_xact_lock(:ns, hashtext(:owner))")


def _lock_creations(conn, owner: str) -> None:
    """One creation of ``owner``'s at a time, until the transaction ends (a lock taken twice is held once more)."""
    conn.execute(_LOCK_CREATIONS, {"ns": NAMESPACE, "owner": owner})


_OPEN = text("""
    SELECT count(*), coalesce(sum(upload_length), 0) FROM uploads
    WHERE owner = :owner AND attachment_id IS NULL AND expires_at > now()
""")


def _admit_open(conn, settings, owner: str, length: int) -> None:
    """Refuse a creation that would give ``owner`` more unfinished uploads, or more declared bytes in them, than the
    limits (``429 too_many_open_uploads``). Nothing bounded them: an adversarial run made 3,200 uploads in 10.6 s
    from one token, each kept a day, and filled a disk to the spool's floor with their parts (every uploader's
    uploads then refused). One uploader's creations take its lock in turn, so those made at once cannot pass the
    limits together (an index on the unfinished uploads' owners keeps the count to that uploader's, migration 0023)."""
    most, most_bytes = settings.max_open_uploads_per_uploader, settings.max_open_upload_bytes_per_uploader
    if not (most or most_bytes):
        return
    _lock_creations(conn, owner)
    open_uploads, declared = conn.execute(_OPEN, {"owner": owner}).one()
    if most and open_uploads >= most:
        raise TooManyOpenUploads(f"{open_uploads} of your resumable uploads are unfinished, the most one uploader may "
                                 "have; finish or terminate some, or wait for them to expire")
    if most_bytes and declared and declared + length > most_bytes:  # alone, an upload of any accepted size
        raise TooManyOpenUploads(f"your unfinished resumable uploads declare {declared} bytes; {length} more would "
                                 f"pass the {most_bytes} one uploader may have open; finish or terminate some, or "
                                 "wait for them to expire")


def find(services, upload_id: uuid.UUID, owner: str) -> Upload:
    """The caller's upload; :class:`UploadNotFound` for anyone else's, :class:`UploadExpired` once expired."""
    with transaction(services.engine) as conn:
        return _visible(conn, upload_id, owner, lock=False)


def append(services, upload_id: uuid.UUID, *, owner: str, offset: int, part: intake.Received,
           spool: Callable[[], object], traceparent: str, tracestate: str | None) -> Upload:
    """Store ``part`` (a PATCH body, received in full) at ``offset``; at the last byte, hand the upload off.

    ``spool()`` gives a writable spool (``write(bytes)``, ``finish() -> Received``,
    ``discard()``) to concatenate the parts into. Raises :class:`OffsetMismatch` when the upload is not
    at ``offset``; the refusals of the handoff (``PermanentError``, ``UploadRejected``)
    terminate the upload and are raised again, but for a retryable one (``SpoolUnavailable``: no room
    to join the parts right now; ``TooManyPending``: the uploader has its fill of uploads still being processed),
    which leaves the upload at ``offset``: the client's retry of the PATCH resumes it.
    """
    upload = _append(services, upload_id, owner=owner, offset=offset, part=part, spool=spool,
                     traceparent=traceparent, tracestate=tracestate)
    if upload.complete:
        log.info("upload %s complete", upload_id, extra={"attachment_id": str(upload.attachment_id)})
        _remove_parts(services.storage, upload_id)
    return upload


def _append(services, upload_id: uuid.UUID, *, owner: str, offset: int, part: intake.Received,
            spool: Callable[[], object], traceparent: str, tracestate: str | None) -> Upload:
    """The PATCH in one transaction, the last byte's attachment, job and outbox row among its writes: a PATCH whose
    session ended (its row's lock with it) commits nothing. The attachment was once recorded in a transaction of
    its own, and a last PATCH paused in its join after its session ended made one of bytes another PATCH's ``204``
    had contradicted, and completed the upload over that PATCH's offset (an adversarial run)."""
    refused: AttacheError | None = None
    stored: str | None = None  # the key of the part this PATCH stored under a token of its own
    staged: list[intake.Staged] = []  # the last byte's bytes, staged
    rolled_back = True  # until the block's last statement ran: an error before then is a clear rollback

    def landed(error: Exception) -> bool:  # the COMMIT's outcome unknown: its attachment row is the witness
        return bool(staged) and intake.committed_after_all(services, staged[0], error)

    def after_commit() -> None:
        if staged:
            intake.window_2()

    try:
        with services.unit_of_work.begin(after_commit=after_commit, landed=landed, behind=True) as work:
            conn = work.conn
            upload = _visible(conn, upload_id, owner, lock=True)
            if upload.complete and offset == upload.length and part.size == 0:
                return upload  # a retried empty PATCH at the end: nothing to do
            if upload.complete or offset != upload.offset:
                raise OffsetMismatch(f"the upload is at offset {upload.offset}, not {offset}")
            if part.size > upload.length - offset:
                raise UploadTooLarge(f"the PATCH goes past Upload-Length {upload.length}")
            if 0 < part.size < upload.length - offset:
                _admit_part(conn, services.settings, upload, offset)
            values = {"updated_at": _now(conn), "expires_at": _now(conn) + lifetime(services.settings)}
            try:
                _check_first_bytes(services, upload, offset, part)
                if offset + part.size == upload.length:  # refused before the parts are joined, probed and staged
                    pending.admit(conn, upload.owner, services.settings.max_pending_per_uploader)
                if part.size:  # moved in where the store can (the spool was fsynced): a copy took the part's bytes
                    # twice on the disk at once, past the spool's floor (an adversarial run), and its time
                    token = None if _keyed_by_offset(conn, upload) else uuid.uuid4().hex
                    key = part_key(upload.id, offset, token)
                    room.admit(conn, services, version=pipeline.get(services.settings.pipeline_version), needing=0,
                               adding=part.size, jobs=0)  # the part leaves the room of the work accepted
                    with kept_alive(conn):  # storage's time, under the row's lock
                        intake.adopt_spool(services.storage, key, part)
                    values["upload_offset"] = offset + part.size
                    if token is not None:
                        stored = key
                        conn.execute(insert(upload_parts).values(upload_id=upload.id, offset=offset, token=token))
                if values.get("upload_offset") == upload.length:
                    whole = _join(services, conn, upload, spool)
                    try:
                        if upload.expected_sha256 is not None and whole.sha256 != upload.expected_sha256:
                            raise DigestMismatch("the upload's bytes do not match the Repr-Digest its creation sent")
                        with kept_alive(conn):
                            staged.append(intake.stage(services, whole))
                    finally:
                        whole.discard()
            except (PermanentError, UploadRejected) as exc:
                if exc.retryable:  # the web's temporary directory is full: the upload stays where it was, to resume
                    raise
                conn.execute(delete(uploads).where(uploads.c.id == upload.id))
                refused = exc
            if refused is None:
                if staged:
                    intake.record(conn, services, staged[0], whole, filename=upload.filename, owner=upload.owner,
                                  traceparent=traceparent, tracestate=tracestate,
                                  idempotency_key=handoff_key(upload.id))
                    values["attachment_id"] = staged[0].attachment_id
                upload = Upload.of(conn.execute(update(uploads).where(uploads.c.id == upload.id).values(**values)
                                                .returning(uploads)).one())
            rolled_back = False  # from here on an error is the COMMIT's own: its rows may have landed
    except intake.LostRace:  # an earlier handoff of this upload committed apart from its row (an earlier release)
        _forget(services, stored, staged)
        found = intake.earlier(services, upload.owner, handoff_key(upload.id), whole.sha256)
        if found is None:  # pragma: no cover - it committed, so it is there
            raise DatabaseUnavailable("the upload could not be recorded; retry") from None
        return _settle(services, replace(upload, offset=upload.length, attachment_id=found.attachment_id))
    except Exception as exc:
        if rolled_back:
            _forget(services, stored, [])
        if staged:  # the staged bytes go with a clear rollback; an unknown COMMIT keeps them for the cleanup
            error = intake.unrecorded(services, staged[0], exc, committing=not rolled_back)
            if error is not exc:
                raise error from exc
        raise
    except BaseException:  # interrupted: an interrupted COMMIT may have landed, so what it names stays then
        if rolled_back:
            _forget(services, stored, staged)
        raise
    if refused is not None:
        log.info("upload %s refused at offset %d: %s", upload_id, offset, refused.error_code)
        _remove_parts(services.storage, upload_id)
        raise refused
    return upload


def _forget(services, stored: str | None, staged: list) -> None:
    """What a PATCH whose transaction rolled back wrote to storage: no row names it, nor ever will."""
    if stored is not None:
        _remove(services.storage, stored)
    for each in staged:
        intake.forget_staging(services, each.key)


def _settle(services, upload: Upload) -> Upload:
    """Record ``upload`` (complete) in its row. Not done (the database is gone again): the client's retry of the
    last PATCH finds the same attachment by the handoff's Idempotency-Key, or the upload expires."""
    with transaction(services.engine) as conn:
        row = conn.execute(update(uploads).where(uploads.c.id == upload.id).values(
            upload_offset=upload.length, attachment_id=upload.attachment_id, updated_at=_now(conn),
            expires_at=_now(conn) + lifetime(services.settings)).returning(uploads)).one_or_none()
    return Upload.of(row) if row is not None else upload


def terminate(services, upload_id: uuid.UUID, owner: str, *, untouched_only: bool = False) -> Upload | None:
    """Forget the upload and remove its partial bytes (tus termination); an attachment it made stays. ``None`` once
    it is terminated.

    ``untouched_only``: the upload of a creation that was refused, terminated unless another request reached it
    meanwhile; then it is kept, and returned as that request left it. A creation replayed with its Idempotency-Key
    hands out the upload's Location while the first creation's body may still be arriving; a PATCH to it then writes
    the upload, even finishes it. Terminated whatever its state
    when the first creation's own append was refused (``409``: the offset had moved), an upload finished by that
    PATCH's ``204`` was gone (HEAD ``404``) and its key free, so a retried creation made a second attachment of the
    file (an adversarial run). Nothing of the refused creation's own body is ever appended (a part is appended
    whole, at the end of its request), so an upload at offset 0 is untouched. One whose row another request holds
    raises :class:`UploadLocked`.
    """
    with transaction(services.engine) as conn:
        upload = _visible(conn, upload_id, owner, lock=True, expired_too=True)
        if untouched_only and (upload.offset or upload.complete):
            return upload
        conn.execute(delete(uploads).where(uploads.c.id == upload_id))
    _remove_parts(services.storage, upload_id)
    return None


def forget_expired(engine: Engine, storage: Storage, *, batch: int = 200, dry_run: bool = False,
                   refused: Callable[[uuid.UUID, AttacheError], None] | None = None) -> int:
    """Forget every expired upload, finished or not, and remove its parts; returns how many.

    Rows are locked with ``SKIP LOCKED``: an upload whose PATCH holds its row
    is left for the next round (that PATCH extends its life anyway).

    ``refused(upload_id, error)``: told of an upload whose part the store would not delete; it raises to end the
    round (the store is down: the batch is rolled back), or returns, and that upload is passed over, its row kept
    for a later round, while the others are forgotten. Without it the first refusal ended the round: one expired
    upload whose part was immutable (``chattr +i``; on S3, a DELETE denied by Object Lock or a policy) kept every
    other expired upload, oldest first, from being forgotten, round after round (a re-attack).
    """
    forgotten, passed = 0, []
    while True:
        with transaction(engine) as conn:
            query = select(uploads.c.id).where(uploads.c.expires_at <= _now(conn))
            if passed:
                query = query.where(uploads.c.id.not_in(passed))
            expired = conn.execute(query.order_by(uploads.c.expires_at).limit(batch)
                                   .with_for_update(skip_locked=True)).scalars().all()
            for upload_id in expired:
                if dry_run:
                    forgotten += 1
                    continue
                try:
                    _remove_parts(storage, upload_id, quietly=False)
                except AttacheError as exc:
                    if refused is None:
                        raise
                    refused(upload_id, exc)
                    passed.append(upload_id)
                    continue
                conn.execute(delete(uploads).where(uploads.c.id == upload_id))
                forgotten += 1
                log.info("forgot expired upload %s", upload_id, extra={"upload_id": str(upload_id)})
        if dry_run or len(expired) < batch:
            return forgotten


def part_removable(engine: Engine, key: str) -> bool | None:
    """Whether the part at ``key`` is needed by no upload: True, False, or None for a key this module never wrote.

    A part is removable once its upload is gone (terminated, refused, forgotten)
    or finished (its bytes are staged), and when no row of ``upload_parts``
    names it though the upload's offset has passed it (its PATCH's transaction
    never committed; no PATCH writes there again). An expired upload's parts go
    with the upload, in :func:`forget_expired`.
    """
    named = _part_name(key)
    if named is None:
        return None
    upload_id, offset, token = named
    with transaction(engine) as conn:
        row = conn.execute(select(uploads.c.attachment_id, uploads.c.upload_offset, upload_parts.c.token)
                           .select_from(uploads.outerjoin(upload_parts, (upload_parts.c.upload_id == uploads.c.id)
                                                          & (upload_parts.c.offset == offset)))
                           .where(uploads.c.id == upload_id)).one_or_none()
    if row is None or row.attachment_id is not None:
        return True
    return token is not None and offset < row.upload_offset and row.token != token


# --- inside ---------------------------------------------------------------------------


def _now(conn) -> datetime:
    """The database's clock: every web process and the scheduler agree on expiry."""
    return conn.exec_driver_sql("SELECT now()").scalar()


def _visible(conn, upload_id: uuid.UUID, owner: str, *, lock: bool, expired_too: bool = False) -> Upload:
    """The caller's upload; with ``lock``, its row locked, or :class:`UploadLocked` at once if another request
    holds it: requests that queued on the lock held a database connection each, and a last PATCH (which needs
    more connections for its handoff while it holds the lock) waited for the pool's whole timeout behind them
    (an adversarial run: 25 PATCHes of one upload, every answer 30 s, six 503s; a paused web holding the lock
    wedged the other web's pool as the client retried).

    Another uploader's upload is not there for the caller, locked or not: the owner is in the locked query's
    condition. Looked at after the lock, an upload being written was ``423`` to another uploader's DELETE (its
    existence told, by the same 404 answered an unknown id), and the DELETE's own moment under the lock was a
    ``423`` to the owner's PATCH (an adversarial run)."""
    query = select(uploads).where(uploads.c.id == upload_id, uploads.c.owner == owner)
    try:
        row = conn.execute(query.with_for_update(nowait=True) if lock else query).one_or_none()
    except OperationalError as exc:
        if lock_not_available(exc):
            raise UploadLocked("another request is writing this upload; retry in a moment") from None
        raise
    if row is None:
        raise UploadNotFound("no such upload")
    if not expired_too and row.expires_at <= _now(conn):
        raise UploadExpired("the upload expired; start a new one")
    return Upload.of(row)


def _admit_part(conn, settings, upload: Upload, offset: int) -> None:
    """:class:`TooManyParts` unless the upload may be stored in one more part that does not finish it (asked under
    the upload's lock; an upload made before migration 0024 names no parts and is not counted)."""
    made = conn.execute(select(func.count()).select_from(upload_parts)
                        .where(upload_parts.c.upload_id == upload.id)).scalar_one()
    if made >= settings.max_parts_per_upload:
        raise TooManyParts(f"the upload is stored in {made} parts already, as many as one may: send the "
                           f"{upload.length - offset} bytes that remain in one PATCH")


def _check_first_bytes(services, upload: Upload, offset: int, part: intake.Received) -> None:
    """:class:`UnsupportedFormat` for a first part whose magic bytes claim no accepted image format.

    Checked when the part holds the first :data:`~app.adapters.imaging.SNIFF_BYTES` (or the whole upload, if
    shorter), so a client sending something else learns it before it sends the rest, not at the last byte. A
    shorter first part is left to the last byte's full check, as is everything else about the image.
    """
    if offset != 0 or part.size < min(imaging.SNIFF_BYTES, upload.length):
        return
    with open(part.path, "rb") as fh:
        imaging.claimed_family(fh.read(imaging.SNIFF_BYTES), services.limits)


def _keyed_by_offset(conn, upload: Upload) -> bool:
    """Whether the upload was made before migration 0024: it has bytes, and no row names its parts."""
    return upload.offset > 0 and conn.execute(
        select(upload_parts.c.offset).where(upload_parts.c.upload_id == upload.id).limit(1)).first() is None


def _join(services, conn, upload: Upload, spool: Callable[[], object]) -> intake.Received:
    """The parts concatenated into a spool, received as a POST's body is."""
    chain = _chain(conn, services.storage, upload)
    sink = spool()
    try:
        with kept_alive(conn):  # 50 MB of parts read from storage under the row's lock
            _copy_parts(services.storage, chain, upload.length, sink)
            return sink.finish()
    except BaseException:
        sink.discard()
        raise


def _chain(conn, storage: Storage, upload: Upload) -> dict[int, ObjectInfo | None]:
    """The part at each offset, from one listing: those ``upload_parts`` names (this PATCH's among them, in its
    transaction; None for one not in storage), and at any other offset a part keyed by the offset alone: an upload
    from before migration 0024, or a PATCH an earlier release's web stored while a deploy replaced the webs."""
    listed = {info.key: info for info in storage.list_objects(parts_prefix(upload.id))}
    chain: dict[int, ObjectInfo | None] = {}
    for key, info in listed.items():
        part = _part_name(key)
        if part is not None and part[2] is None:
            chain[part[1]] = info
    named = conn.execute(select(upload_parts.c.offset, upload_parts.c.token)
                         .where(upload_parts.c.upload_id == upload.id)).all()
    chain.update({offset: listed.get(part_key(upload.id, offset, token)) for offset, token in named})
    return chain


def _copy_parts(storage: Storage, chain: dict[int, ObjectInfo | None], length: int, sink) -> None:
    """Write the chain of parts from offset 0 to ``length`` into ``sink``; :class:`PartsMissing` if broken."""
    position = 0
    while position < length:
        info = chain.get(position)
        if info is None or info.size == 0:
            raise PartsMissing(f"the upload's bytes from offset {position} are missing; start a new upload")
        with contextlib.closing(storage.open_stream(info.key, chunk_size=COPY_CHUNK)) as stream:
            for chunk in stream:
                sink.write(chunk)
        position += info.size
    if position != length:
        raise PartsMissing("the upload's parts do not add up to its length; start a new upload")


def _remove_parts(storage: Storage, upload_id: uuid.UUID, *, quietly: bool = True) -> None:
    try:
        for key in list(storage.list_keys(parts_prefix(upload_id))):
            storage.delete(key)
    except AttacheError:
        if not quietly:
            raise
        log.warning("could not remove the parts of upload %s; the staging cleanup will", upload_id)


def _remove(storage: Storage, key: str) -> None:
    """Remove one part, quietly: one left is removed with its upload, or by the staging cleanup."""
    try:
        storage.delete(key)
    except AttacheError:
        log.warning("could not remove the part %s; the staging cleanup will", key)
