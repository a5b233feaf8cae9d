"""Retry policies: validated value objects, in the manner of Temporal's ``RetryPolicy``.

A policy answers two questions for a step that failed in attempt *n*:
may it run again (attempts left and the error is retryable), and when
(exponential backoff with a cap and jitter). The policies in force are
listed in ``docs/retries.md``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from app.errors import PermanentError


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    initial_interval: float = 2.0
    backoff_coefficient: float = 2.0
    max_interval: float = 300.0
    jitter: float = 0.2
    non_retryable: tuple[type[BaseException], ...] = field(default=(PermanentError,))

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.initial_interval < 0:
            raise ValueError("initial_interval must be >= 0")
        if self.backoff_coefficient < 1:
            raise ValueError("backoff_coefficient must be >= 1")
        if self.max_interval < self.initial_interval:
            raise ValueError("max_interval must be >= initial_interval")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be between 0 and 1")
        for cls in self.non_retryable:
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                raise ValueError(f"non_retryable entries must be exception types, not {cls!r}")

    def retryable(self, error: BaseException) -> bool:
        return not isinstance(error, self.non_retryable)

    def attempts_left(self, attempt: int) -> bool:
        return attempt < self.max_attempts

    def should_retry(self, attempt: int, error: BaseException) -> bool:
        return self.retryable(error) and self.attempts_left(attempt)

    def delay(self, attempt: int, *, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt ``attempt + 1``."""
        base = min(self.max_interval, self.initial_interval * self.backoff_coefficient ** max(0, attempt - 1))
        if self.jitter:
            spread = base * self.jitter
            base += (rng or random).uniform(-spread, spread)
        return max(0.0, min(self.max_interval, base))
