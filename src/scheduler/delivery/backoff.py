"""How long to wait before the next attempt (DELIV-4): exponential from a base, with jitter,
capped, never sooner than the provider's ``Retry-After``.

The randomness is an injected ``random.Random`` (never the module-level one): a replica seeds
its own, a test a fixed one, so every schedule can be replayed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

# 2**62 times any sane base is past every cap; a larger exponent would only overflow a float.
_MAX_EXPONENT = 62


class Jitter(StrEnum):
    """``full``: uniform between 0 and the exponential ceiling (AWS's "full jitter");
    ``decorrelated``: uniform between the base and three times the previous delay."""

    FULL = "full"
    DECORRELATED = "decorrelated"


@dataclass(frozen=True)
class RetryPolicy:
    """The schedule of one channel's retries: the base and cap of the backoff (seconds), the
    attempts a delivery gets in all (the first send included), and the jitter."""

    base_seconds: float
    cap_seconds: float
    max_attempts: int
    jitter: Jitter = Jitter.FULL

    def __post_init__(self) -> None:
        if not self.base_seconds > 0:
            raise ValueError(f"the backoff's base must be positive, got {self.base_seconds}")
        if not self.cap_seconds >= self.base_seconds:
            raise ValueError(f"the backoff's cap ({self.cap_seconds}) must be at least its base ({self.base_seconds})")
        if self.max_attempts < 1:
            raise ValueError(f"a delivery needs at least one attempt, got {self.max_attempts}")

    def delay(self, attempt: int, rng: random.Random, *, previous: float | None = None,
              retry_after: float | None = None) -> float:
        """The wait after failed attempt number ``attempt`` (``backoff_seconds`` with this policy)."""
        return backoff_seconds(attempt, base=self.base_seconds, cap=self.cap_seconds, rng=rng,
                               jitter=self.jitter, previous=previous, retry_after=retry_after)


def backoff_seconds(attempt: int, *, base: float, cap: float, rng: random.Random,
                    jitter: Jitter = Jitter.FULL, previous: float | None = None,
                    retry_after: float | None = None) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1 for the first send).

    Full jitter draws from ``[0, min(cap, base * 2**(attempt - 1))]``; decorrelated jitter from
    ``[base, 3 * previous]`` (``previous``: the delay before this attempt, the base when
    unknown), capped. Either way the wait is at least ``retry_after`` (which its parser has
    already capped), so a provider that asked for more time gets it."""
    if attempt < 1:
        raise ValueError(f"attempts count from 1, got {attempt}")
    if jitter is Jitter.FULL:
        ceiling = min(cap, base * 2.0 ** min(attempt - 1, _MAX_EXPONENT))
        delay = rng.uniform(0.0, ceiling)
    else:
        last = base if previous is None or previous < base else min(previous, cap)
        delay = min(cap, rng.uniform(base, 3.0 * last))
    delay = min(max(delay, 0.0), cap)
    return max(delay, retry_after) if retry_after is not None and retry_after > 0 else delay
