"""Configuration from the environment (12-factor).

Every setting has a documented default (see ``docs/configuration.md``) and
an environment variable. A bad value raises :class:`ConfigError` naming the
variable, and every process entry point turns that into a one-line message
and a non-zero exit before doing anything else.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Mapping

from app.adapters.imaging.budget import DEFAULT_MAX_DECODE_BYTES
from app.adapters.imaging.sniff import PROCESSED_FORMATS
from app.core.auth import parse_tokens
from app.errors import ConfigError

#: the ``BROKER_URL`` schemes of each broker kind (unset: the PostgreSQL broker in the database)
BROKER_SCHEMES = {"rabbitmq": ("amqp", "amqps"), "postgres": ("postgresql",)}
DEFAULT_DATA_DIR = "var"
DEFAULT_STORAGE_URL = "file://./var/storage"


def _int(minimum: int, maximum: int | None = None) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not an integer") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            raise ConfigError(f"{name}={raw!r} must be {bound}")
        return value

    return parse


#: the longest a retention may be: a PostgreSQL interval's and timestamp's range are finite, and a setting of 1e12 s
#: made every round of its cleanup fail ("timestamp out of range": a re-attack)
CENTURY_SECONDS = 100 * 365.25 * 24 * 3600


def _float(minimum: float, maximum: float = math.inf) -> Callable[[str, str], float]:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a number") from None
        if not math.isfinite(value):  # float() takes "nan" and "inf": a deadline of nan is never reached
            raise ConfigError(f"{name}={raw!r} is not a finite number")
        if value < minimum:
            raise ConfigError(f"{name}={raw!r} must be >= {minimum}")
        if value > maximum:
            raise ConfigError(f"{name}={raw!r} must be <= {maximum:g}")
        return value

    return parse


def _str(name: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(f"{name} must not be empty")
    return raw.strip()


def _url(*schemes: str, optional: bool = False) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        raw = raw.strip()
        if optional and not raw:
            return ""
        if not any(raw.startswith(s + "://") for s in schemes):
            raise ConfigError(f"{name}={raw!r} must start with one of: " + ", ".join(s + "://" for s in schemes))
        return raw

    return parse


PROCESSED = tuple(PROCESSED_FORMATS)


def _formats(name: str, raw: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(item.strip().upper() for item in raw.split(",") if item.strip()))
    unknown = [f for f in chosen if f not in PROCESSED]
    if not chosen or unknown:
        raise ConfigError(f"{name}={raw!r}: choose from {', '.join(PROCESSED)}")
    return chosen


def _bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use 1/0, true/false)")


def setting(env: str, default: Any, parse: Callable[[str, str], Any], doc: str) -> Any:
    return field(default=default, metadata={"env": env, "parse": parse, "doc": doc})


#: settings that were renamed, and what to set instead: a deployment that still sets one does not start (its
#: value would otherwise be ignored without a word)
RENAMED = {
    "ATTACHE_SMALL_IMAGE_PIXELS": "it is ATTACHE_ONE_STEP_MAX_PIXELS, whose default is now every image (0 still "
                                  "gives every image a render message per variant)",
}


@dataclass(frozen=True)
class Settings:
    database_url: str = setting(
        "DATABASE_URL", "", _url("postgresql", "postgresql+psycopg2", optional=True),
        "PostgreSQL, the only source of truth; unset: an embedded PostgreSQL under `ATTACHE_DATA_DIR/pgdata`, "
        "started by the first process that needs it (single-node mode, `docs/deploy.md`). libpq parameters in its "
        "query string win over attache's own, such as the keepalives that find a silent server in about 10 s, "
        "which the server is asked for on its side too, in `options` (`keepalives_idle`, `keepalives_interval`, "
        "`keepalives_count`, `tcp_user_timeout`; a pooler in between must accept `options`: `docs/operations.md`)")
    broker_url: str = setting(
        "BROKER_URL", "", _url(*BROKER_SCHEMES["rabbitmq"], *BROKER_SCHEMES["postgres"], optional=True),
        "the broker: `amqp://` RabbitMQ (quorum queues), `postgresql://` the PostgreSQL broker in that database; "
        "unset: the PostgreSQL broker in the database of `DATABASE_URL`. An `amqp://` URL's `heartbeat` "
        "(seconds) wins over attache's: 10 s on consuming connections, 30 s on publishing ones "
        "(`docs/operations.md`)")
    data_dir: str = setting(
        "ATTACHE_DATA_DIR", DEFAULT_DATA_DIR, _str,
        "where the embedded PostgreSQL keeps its data (`pgdata/` below it) when `DATABASE_URL` is unset")
    storage_url: str = setting(
        "STORAGE_URL", DEFAULT_STORAGE_URL, _url("file", "s3"),
        "object storage: file://PATH or s3://BUCKET?endpoint=URL&region=REGION (give the region: without it, "
        "the first download asks the store for it, and one that does not answer holds the request's thread)")
    s3_access_key: str = setting("S3_ACCESS_KEY", "", lambda n, r: r, "S3 access key")
    s3_secret_key: str = setting("S3_SECRET_KEY", "", lambda n, r: r, "S3 secret key")
    port: int = setting("PORT", 8000, _int(1, 65535), "HTTP port of web")
    pipeline_version: int | None = setting(
        "ATTACHE_PIPELINE_VERSION", None, _int(1), "pipeline version of new uploads (default: the newest registered)")
    max_upload_bytes: int = setting(
        "ATTACHE_MAX_UPLOAD_BYTES", 50 * 1024 * 1024, _int(1), "largest accepted upload, bytes")
    body_idle_seconds: float = setting(
        "ATTACHE_BODY_IDLE_SECONDS", 60.0, _float(1),
        "a client that sends no body bytes for this long is cut off (400 incomplete_body), as is one that takes "
        "longer to read a download's next 64 KiB (a sign-in form's body, which anyone may post, has 1 s in all); "
        "spool files untouched for ten times this are removed as abandoned")
    database_answer_seconds: float = setting(
        "ATTACHE_DATABASE_ANSWER_SECONDS", 30.0, _float(12),
        "the web waits this long at most for PostgreSQL's answer to a statement, a COMMIT or a pool's ping; then "
        "it cuts the connection, logs it and answers 503: a pooler or proxy whose backend went silent still "
        "acknowledges every byte, so TCP never finds it; at least 12, above the web's slowest statements (the "
        "console's searches and charts stop at 5 and 10 s, its lock waits at 10 s); a connect has libpq's "
        "connect_timeout (5 s)")
    background_answer_seconds: float = setting(
        "ATTACHE_BACKGROUND_ANSWER_SECONDS", 300.0, _float(12),
        "the worker, the scheduler and the CLI's commands (not the release's migrations) wait this long at most "
        "for PostgreSQL's answer to a statement, a COMMIT or "
        "a pool's ping; then they cut the connection and log it, and the step or the sweeper's round fails and "
        "runs again: behind a pooler or proxy whose backend went silent and lost their bytes, a worker's thread "
        "and a scheduler's rounds waited for good, and accepted uploads stayed queued until both were restarted; "
        "at least 12, above their slowest statements; the PostgreSQL broker's connections have the same deadline (the "
        "web's: ATTACHE_DATABASE_ANSWER_SECONDS)")
    max_bodies_per_uploader: int = setting(
        "ATTACHE_MAX_BODIES_PER_UPLOADER", 8, _int(0),
        "upload bodies (POST /v1/attachments, tus creations with a body and PATCHes) one uploader may send to "
        "one web process at once; one more is refused with 429 too_many_uploads_at_once before it is read, so "
        "one uploader's slow bodies cannot hold every thread of a process; 0: no limit")
    max_downloads_per_client: int = setting(
        "ATTACHE_MAX_DOWNLOADS_PER_CLIENT", 16, _int(0),
        "downloads one web process streams to one client (token) at once; one more is refused with 429 "
        "too_many_downloads_at_once, so one client's downloads read slowly cannot hold every thread of a process "
        "(redirects to presigned URLs hold none); 0: no limit")
    max_reads_per_client: int = setting(
        "ATTACHE_MAX_READS_PER_CLIENT", 16, _int(0),
        "reads (GET and HEAD of the API and the /ops console, downloads and uploads aside: they have their own "
        "bounds) one web process answers one client (a token's or a browser session's principal, operators too) at "
        "once; one more is refused at once with 429 too_many_reads_at_once and Retry-After, so one client's reads "
        "cannot take a process's threads and CPU (600 pages of 1000 events in 3 s from one token took 19 s of its "
        "CPU, and uploads waited seconds for their 202); 0: no limit")
    spool_min_free_bytes: int = setting(
        "ATTACHE_SPOOL_MIN_FREE_BYTES", 128 * 1024 * 1024, _int(0),
        "free space an upload's spool file (in the web's temporary directory, TMPDIR) always leaves on its "
        "filesystem, and on the file storage's filesystem the room the unfinished jobs hold there besides: a body "
        "that would go below is refused with 503 spool_unavailable and Retry-After (before it is read, when its "
        "declared length alone would; docs/deploy.md, Disk room); on the filesystem backend, an upload is also refused (503 "
        "storage_unavailable, Retry-After) unless the storage's disk keeps this much free beyond room for what "
        "every unfinished job still writes and this upload's job will, in bytes and in files (an inode kept "
        "free for each 16 KiB of this) (docs/architecture.md); 0: no floor")
    max_pending_per_uploader: int = setting(
        "ATTACHE_MAX_PENDING_PER_UPLOADER", 1000, _int(0),
        "uploads of one uploader accepted and not yet ready or failed; one more is refused with 429 and "
        "Retry-After, so one uploader cannot put unbounded work ahead of everyone else's (uploads in flight at "
        "the same moment may pass it by their number). Backfills and replays, the operators' work, do not count; "
        "0: no limit")
    max_open_uploads_per_uploader: int = setting(
        "ATTACHE_MAX_OPEN_UPLOADS_PER_UPLOADER", 100, _int(0),
        "resumable uploads (/v1/uploads) of one uploader created and not yet finished, terminated or expired; one "
        "more creation is refused with 429 too_many_open_uploads, so one uploader cannot hold unbounded rows and "
        "partial bytes for ATTACHE_UPLOAD_EXPIRY_SECONDS; 0: no limit")
    max_open_upload_bytes_per_uploader: int = setting(
        "ATTACHE_MAX_OPEN_UPLOAD_BYTES_PER_UPLOADER", 2 * 1024 ** 3, _int(0),
        "the Upload-Length of one uploader's unfinished resumable uploads added up: a creation that would pass it "
        "is refused with 429 too_many_open_uploads, bounding the partial bytes one uploader can keep on the disk "
        "(an uploader with none open may still make one of any accepted size); 0: no limit")
    max_parts_per_upload: int = setting(
        "ATTACHE_MAX_PARTS_PER_UPLOAD", 1000, _int(1),
        "parts a resumable upload (/v1/uploads) is stored in, one a PATCH: a PATCH that would make one more without "
        "finishing the upload is refused with 400 too_many_parts, the upload kept at its offset; a PATCH of all "
        "that remains is always taken. Bounds the disk blocks and files of tiny PATCHes and the last PATCH's join; "
        "ATTACHE_UPLOAD_CHUNK_BYTES times this must hold ATTACHE_MAX_UPLOAD_BYTES")
    max_pixels: int = setting(
        "ATTACHE_MAX_PIXELS", 64_000_000, _int(1), "largest declared width*height; above is a decompression bomb")
    max_dimension: int = setting(
        "ATTACHE_MAX_DIMENSION", 20_000, _int(1), "longest accepted side in pixels")
    max_decode_bytes: int = setting(
        "ATTACHE_MAX_DECODE_BYTES", DEFAULT_MAX_DECODE_BYTES, _int(1),
        "largest memory one render may need, priced from the header (decoded pixels by mode, decoder "
        "buffers, conversions); above is image_too_large")
    accepted_formats: tuple = setting(
        "ATTACHE_ACCEPTED_FORMATS", PROCESSED, _formats,
        "comma-separated image formats accepted at upload (a subset of the eight processed; HEIF is HEIC)")
    one_step_max_pixels: int = setting(
        "ATTACHE_ONE_STEP_MAX_PIXELS", 64_000_000, _int(0),
        "an image of at most this many pixels (width*height) has all its variants made in one step, its "
        "inspect (two at a time, from one fetch and one decode per size), instead of one render message per "
        "variant; the default is every image ATTACHE_MAX_PIXELS accepts by default. Lower it to spread a large "
        "image's renders over several worker machines; 0: every image gets a render message per variant")
    lease_seconds: float = setting(
        "ATTACHE_LEASE_SECONDS", 60.0, _float(0.5), "how long a claim holds without a heartbeat")
    max_attempts: int = setting(
        "ATTACHE_MAX_ATTEMPTS", 5, _int(1, 100), "managed attempts per job before failed")
    retry_initial_seconds: float = setting(
        "ATTACHE_RETRY_INITIAL_SECONDS", 2.0, _float(0), "first managed-retry delay after a transient error")
    retry_max_seconds: float = setting(
        "ATTACHE_RETRY_MAX_SECONDS", 300.0, _float(0), "longest managed-retry delay")
    staging_grace_seconds: float = setting(
        "ATTACHE_STAGING_GRACE_SECONDS", 3600.0, _float(0),
        "a staged object with no attachment row is removed after this long")
    failed_retention_seconds: float = setting(
        "ATTACHE_FAILED_RETENTION_SECONDS", 7 * 24 * 3600.0, _float(0, CENTURY_SECONDS),
        "the staged original of a failed job is kept this long after it failed (for replay)")
    object_grace_seconds: float = setting(
        "ATTACHE_OBJECT_GRACE_SECONDS", 3600.0, _float(0),
        "an object under attachments/ that no variant row references is removed after this long")
    object_decision_grace_seconds: float = setting(
        "ATTACHE_OBJECT_DECISION_GRACE_SECONDS", 300.0, _float(0),
        "a decision of the object GC to remove an object, left by a GC that died before its delete, is finished "
        "this long after it (not sooner: a GC whose database session was lost may still be deleting); the claims "
        "of the attachment's jobs wait meanwhile")
    presign_seconds: int = setting(
        "ATTACHE_PRESIGN_SECONDS", 300, _int(0, 7 * 24 * 3600),
        "on S3, downloads redirect to a presigned URL valid this long; 0 streams through the web instead")
    idempotency_ttl_seconds: float = setting(
        "ATTACHE_IDEMPOTENCY_TTL_SECONDS", 24 * 3600.0, _float(1),
        "how long an Idempotency-Key keeps returning the same attachment")
    upload_expiry_seconds: float = setting(
        "ATTACHE_UPLOAD_EXPIRY_SECONDS", 24 * 3600.0, _float(1),
        "a resumable upload (/v1/uploads) expires this long after its last PATCH (at most "
        "ATTACHE_IDEMPOTENCY_TTL_SECONDS, which keeps its last PATCH safe to retry); the staging cleanup "
        "then removes its partial bytes, and a finished upload's URL is forgotten")
    upload_chunk_bytes: int = setting(
        "ATTACHE_UPLOAD_CHUNK_BYTES", 5 * 1024 * 1024, _int(1),
        "the upload page sends a file in resumable PATCH requests of at most this many bytes; a dropped "
        "connection costs at most one")
    retire_grace_seconds: float = setting(
        "ATTACHE_RETIRE_GRACE_SECONDS", 7 * 24 * 3600.0, _float(0, CENTURY_SECONDS),
        "objects of a pipeline version are collected this long after a newer version is ready (below "
        "ATTACHE_PRESIGN_SECONDS, a presigned URL of the older version handed out just before can fail before it "
        "expires; caches and pages holding old URLs need it longer still)")
    cleanup_interval_seconds: float = setting(
        "ATTACHE_CLEANUP_INTERVAL_SECONDS", 300.0, _float(0.1), "how often the staging and object cleanups run")
    outbox_publish_after_seconds: float = setting(
        "ATTACHE_OUTBOX_PUBLISH_AFTER_SECONDS", 10.0, _float(0),
        "an unmarked outbox row older than this is published by the scheduler")
    outbox_interval_seconds: float = setting(
        "ATTACHE_OUTBOX_INTERVAL_SECONDS", 5.0, _float(0.1), "how often the scheduler sweeps the outbox")
    lease_interval_seconds: float = setting(
        "ATTACHE_LEASE_INTERVAL_SECONDS", 10.0, _float(0.1), "how often the scheduler looks for expired leases")
    reconcile_after_seconds: float = setting(
        "ATTACHE_RECONCILE_AFTER_SECONDS", 300.0, _float(0),
        "a queued job, or a processing job between steps, with no pending message and nothing announced for "
        "this long is announced again "
        "(doubling per re-announcement); keep it above the Dramatiq retry budget")
    reconcile_interval_seconds: float = setting(
        "ATTACHE_RECONCILE_INTERVAL_SECONDS", 30.0, _float(0.1), "how often the scheduler looks for stranded jobs")
    counter_fold_interval_seconds: float = setting(
        "ATTACHE_COUNTER_FOLD_INTERVAL_SECONDS", 60.0, _float(0.1),
        "how often the scheduler moves the transitions counted since into the totals /metrics reads (a scrape "
        "adds up the totals and what is not folded yet, so it is exact either way)")
    broker_retries: int = setting(
        "ATTACHE_BROKER_RETRIES", 5, _int(0, 50),
        "Dramatiq retries for a step whose outcome could not be recorded (then .XQ)")
    step_time_limit_seconds: float = setting(
        "ATTACHE_STEP_TIME_LIMIT_SECONDS", 600.0, _float(1),
        "a worker's step that runs longer than this (wall-clock, from when a worker thread starts it) stops holding "
        "its job: the attempt ends `step_timeout` and is retried as a lost worker's is; Dramatiq interrupts the step "
        "30 s later (a quarter of a shorter limit), and a step still running 30 s after that is inside a call no "
        "interrupt reaches (a render in C): its worker process exits, for its process manager to start a fresh one; "
        "the waits for PostgreSQL and for storage may take at most half of it (below 600, lower "
        "ATTACHE_DATABASE_WAIT_SECONDS and ATTACHE_STORAGE_WAIT_SECONDS with it; an S3 call can take 90 s more, "
        "and 1 s more per 256 KiB it moves, its deadline)")
    database_wait_seconds: float = setting(
        "ATTACHE_DATABASE_WAIT_SECONDS", 300.0, _float(0),
        "how long a worker's step that finds PostgreSQL unreachable waits for it (asking every second) and then "
        "runs again, before the failure costs one of its Dramatiq retries; 0: no wait; at most half of "
        "ATTACHE_STEP_TIME_LIMIT_SECONDS")
    storage_wait_seconds: float = setting(
        "ATTACHE_STORAGE_WAIT_SECONDS", 300.0, _float(0),
        "how long a worker's step that finds storage unavailable (full, unreachable, refusing writes) tries its "
        "storage call again, holding its lease, from 1 s apart to 30 s, before the failure costs the job an "
        "attempt (a managed retry); 0: no wait; at most half of ATTACHE_STEP_TIME_LIMIT_SECONDS")
    broker_min_backoff_ms: int = setting(
        "ATTACHE_BROKER_MIN_BACKOFF_MS", 1000, _int(1), "first Dramatiq retry delay, ms")
    broker_delivery_limit: int = setting(
        "ATTACHE_BROKER_DELIVERY_LIMIT", 20, _int(1),
        "deliveries of one message before the broker dead-letters it to `<queue>.XQ` (RabbitMQ: the "
        "quorum queue's x-delivery-limit; PostgreSQL broker: counted at each claim)")
    publish_timeout_seconds: float = setting(
        "ATTACHE_PUBLISH_TIMEOUT_SECONDS", 5.0, _float(0.1),
        "how long a publish waits for each RabbitMQ answer (a confirm; connecting: twice this), "
        "then leaves its outbox row to the relay")
    webhook_allow_private: bool = setting(
        "ATTACHE_WEBHOOK_ALLOW_PRIVATE", False, _bool,
        "allow webhook URLs that resolve to loopback, private or link-local addresses (SSRF: keep off in "
        "production; checked at registration and before every delivery)")
    webhook_timeout_seconds: float = setting(
        "ATTACHE_WEBHOOK_TIMEOUT_SECONDS", 5.0, _float(0.1),
        "a webhook endpoint must connect, take the request and answer within this many seconds in all, "
        "else the attempt failed")
    webhook_concurrency: int = setting(
        "ATTACHE_WEBHOOK_CONCURRENCY", 4, _int(1, 64),
        "webhook deliveries in flight at once in the scheduler (one per subscription at a time)")
    webhook_max_attempts: int = setting(
        "ATTACHE_WEBHOOK_MAX_ATTEMPTS", 17, _int(1, 100),
        "attempts per webhook delivery before it is failed; with the default delays they span about 29 hours (at "
        "least 23 with jitter), as Standard Webhooks' example schedule does (27.6 hours)")
    webhook_retry_initial_seconds: float = setting(
        "ATTACHE_WEBHOOK_RETRY_INITIAL_SECONDS", 5.0, _float(0),
        "first delay before a failed webhook delivery is tried again (doubling, with jitter)")
    webhook_retry_max_seconds: float = setting(
        "ATTACHE_WEBHOOK_RETRY_MAX_SECONDS", 21600.0, _float(0), "longest delay between webhook delivery attempts")
    webhook_delivery_retention_seconds: float = setting(
        "ATTACHE_WEBHOOK_DELIVERY_RETENTION_SECONDS", 7 * 24 * 3600.0, _float(0, CENTURY_SECONDS),
        "a delivered webhook delivery's row is deleted this long after it was delivered (pending and failed ones "
        "are kept: the failed are the operator's to redeliver)")
    webhook_interval_seconds: float = setting(
        "ATTACHE_WEBHOOK_INTERVAL_SECONDS", 1.0, _float(0.1),
        "how often the scheduler looks for webhook deliveries that are due")
    api_tokens: tuple = setting(
        "ATTACHE_API_TOKENS", (), parse_tokens,
        "who may do what: TOKEN=PRINCIPAL:ROLE, comma-separated; roles uploader, operator")
    secret_key: str = setting(
        "ATTACHE_SECRET_KEY", "", lambda n, r: r.strip(),
        "signs console login sessions; empty: derived from the API tokens, so every web worker agrees")
    fault: str = setting("ATTACHE_FAULT", "", lambda n, r: r.strip(), "named fault point (tests only)")
    dev_mode: bool = setting("ATTACHE_DEV", False, _bool, "development mode (make up)")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        environ = os.environ if environ is None else environ
        for old, why in RENAMED.items():
            if old in environ:
                raise ConfigError(f"{old} is no longer read: {why}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            env = f.metadata["env"]
            raw = environ.get(env)
            if raw is not None:
                values[f.name] = f.metadata["parse"](env, raw)
        settings = cls(**values)
        if settings.pipeline_version is None:
            from app.core.pipeline import NEWEST

            settings = replace(settings, pipeline_version=NEWEST)
        settings.validate()
        return settings

    def validate(self) -> None:
        from app import faults

        if self.fault and self.fault not in faults.POINTS:
            raise ConfigError(
                f"ATTACHE_FAULT={self.fault!r} is not a fault point; known: {', '.join(sorted(faults.POINTS))}")
        from app.core.pipeline import REGISTRY

        if self.pipeline_version is not None and self.pipeline_version not in REGISTRY:
            raise ConfigError(f"ATTACHE_PIPELINE_VERSION={self.pipeline_version} is not registered; known: "
                              + ", ".join(str(v) for v in sorted(REGISTRY)))
        if self.retry_max_seconds < self.retry_initial_seconds:
            raise ConfigError("ATTACHE_RETRY_MAX_SECONDS must be >= ATTACHE_RETRY_INITIAL_SECONDS")
        for name, wait in (("ATTACHE_DATABASE_WAIT_SECONDS", self.database_wait_seconds),
                           ("ATTACHE_STORAGE_WAIT_SECONDS", self.storage_wait_seconds)):
            if wait > self.step_time_limit_seconds / 2:
                raise ConfigError(f"{name} must be at most {self.step_time_limit_seconds / 2:g}: half of a step's "
                                  f"time limit (ATTACHE_STEP_TIME_LIMIT_SECONDS, {self.step_time_limit_seconds:g} s), "
                                  "which also holds its run after it")
        if self.lease_interval_seconds > self.lease_seconds * 10:
            raise ConfigError("ATTACHE_LEASE_INTERVAL_SECONDS is more than ten leases long; expired work would wait")
        if self.upload_chunk_bytes * self.max_parts_per_upload < self.max_upload_bytes:
            raise ConfigError(f"ATTACHE_UPLOAD_CHUNK_BYTES ({self.upload_chunk_bytes}) times "
                              f"ATTACHE_MAX_PARTS_PER_UPLOAD ({self.max_parts_per_upload}) must hold "
                              f"ATTACHE_MAX_UPLOAD_BYTES ({self.max_upload_bytes}): the upload page could not finish "
                              "its largest uploads")

    @property
    def broker_kind(self) -> str:
        """``rabbitmq`` or ``postgres``: which broker ``BROKER_URL`` names (unset: ``postgres``)."""
        if self.broker_url.startswith(tuple(s + "://" for s in BROKER_SCHEMES["rabbitmq"])):
            return "rabbitmq"
        return "postgres"

    @property
    def embedded_database(self) -> bool:
        """True when ``DATABASE_URL`` is unset: attache runs its own PostgreSQL under ``data_dir``."""
        return not self.database_url

    @classmethod
    def documented(cls) -> list[tuple[str, Any, str]]:
        """(variable, default, meaning) for every setting: used by docs and tests."""
        return [(f.metadata["env"], f.default, f.metadata["doc"]) for f in fields(cls)]


DEFAULT_NOTES = {
    "ATTACHE_ACCEPTED_FORMATS": f"`{','.join(PROCESSED_FORMATS)}`",
    "DATABASE_URL": "(unset: embedded PostgreSQL)",
    "BROKER_URL": "(unset: PostgreSQL broker)",
    "ATTACHE_API_TOKENS": "(none; in development mode a token is created under `var/dev-token`)",
    "ATTACHE_PIPELINE_VERSION": "the newest registered",
    "ATTACHE_MAX_DECODE_BYTES": f"`{DEFAULT_MAX_DECODE_BYTES}` ({DEFAULT_MAX_DECODE_BYTES // 2**20} MiB)",
}


def markdown_table() -> str:
    """The settings table of ``docs/configuration.md`` (``python -m app.config`` prints it)."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for env, default, doc in Settings.documented():
        shown = DEFAULT_NOTES.get(env) or ("(empty)" if default in ("", ()) else f"`{default}`")
        lines.append(f"| `{env}` | {shown} | {doc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
