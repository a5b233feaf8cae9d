"""Retry policies: when a step runs again, in the manner of Temporal's ``RetryPolicy``.

A policy answers one question for a step that failed in attempt *n*: how
long to wait before attempt *n + 1* (exponential backoff with a cap and
jitter). Whether it runs again at all is decided elsewhere, each fact in
one place:

* the error's class says whether it is retryable
  (:attr:`app.errors.AttacheError.retryable`, :func:`app.errors.retryable`);
* the job row says how many attempts it has: ``jobs.max_attempts``, set
  from ``ATTACHE_MAX_ATTEMPTS`` when the job is created and raised by an
  operator's replay, enforced by :func:`app.core.states.retry_later` and
  lease recovery. Attempts are counted per job, not per step.

Each step's policy is built by :meth:`app.core.steps.Step.retry_policy`;
the policies in force are listed in ``docs/retries.md``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    initial_interval: float = 2.0
    backoff_coefficient: float = 2.0
    max_interval: float = 300.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.initial_interval < 0:
            raise ValueError("initial_interval must be >= 0")
        if self.backoff_coefficient < 1:
            raise ValueError("backoff_coefficient must be >= 1")
        if self.max_interval < self.initial_interval:
            raise ValueError("max_interval must be >= initial_interval")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be between 0 and 1")

    def delay(self, attempt: int, *, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt ``attempt + 1``."""
        base = min(self.max_interval, self.initial_interval * self.backoff_coefficient ** max(0, attempt - 1))
        if self.jitter:
            spread = base * self.jitter
            base += (rng or random).uniform(-spread, spread)
        return max(0.0, min(self.max_interval, base))
