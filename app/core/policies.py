"""The retry policy of every pipeline step (listed in ``docs/retries.md``).

Attempts are counted per job (a claim is an attempt), so every step shares
the job's ``max_attempts``; what differs per step is how long to wait and
which errors are never worth retrying.
"""

from __future__ import annotations

from app.config import Settings
from app.core.retry import RetryPolicy
from app.errors import EffectMissing, PermanentError, PoisonMessage

NEVER_RETRY = (PermanentError, PoisonMessage, EffectMissing)


def step_policies(settings: Settings) -> dict[str, RetryPolicy]:
    base = dict(max_attempts=settings.max_attempts, max_interval=settings.retry_max_seconds,
                non_retryable=NEVER_RETRY)
    return {
        # reads a header from storage: cheap, so retry soon
        "inspect": RetryPolicy(initial_interval=settings.retry_initial_seconds, backoff_coefficient=2.0,
                               jitter=0.2, **base),
        # decodes and writes objects: storage trouble tends to last, back off harder
        "render": RetryPolicy(initial_interval=settings.retry_initial_seconds * 2, backoff_coefficient=3.0,
                              jitter=0.3, **base),
        # one database transaction plus a staging delete
        "publish": RetryPolicy(initial_interval=settings.retry_initial_seconds, backoff_coefficient=2.0,
                               jitter=0.2, **base),
    }
