"""The message contract: ``jobs.schema.json`` (installed with this package), checked both ways.

Every message is built here, validated before it is written to the outbox
(so it is valid before publish) and validated again on consume, where a
failure makes it a :class:`PoisonMessage` that is dead-lettered unprocessed.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from app.errors import InvalidMessage

#: installed with the package (``package-data``); the top-level ``schemas/`` holds a link to it
SCHEMA_PATH = Path(__file__).with_name("schemas") / "jobs.schema.json"
SCHEMA_VERSION = 1

@lru_cache(maxsize=1)
def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def validate(payload: Any) -> dict:
    errors = sorted(_validator().iter_errors(payload), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "(root)"
        raise InvalidMessage(f"message does not match jobs.schema.json at {where}: {first.message[:200]}")
    return payload


def build(*, job_id: uuid.UUID, attachment_id: uuid.UUID, pipeline_version: int, attempt: int,
          step: str, traceparent: str, tracestate: str | None = None, variant: str | None = None) -> dict:
    payload: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "job_id": str(job_id),
        "attachment_id": str(attachment_id),
        "pipeline_version": pipeline_version,
        "attempt": attempt,
        "step": str(step),  # a Step's plain value
        "traceparent": traceparent,
        "created_at": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
    }
    if variant is not None:
        payload["variant"] = variant
    if tracestate:
        payload["tracestate"] = tracestate
    return validate(payload)
