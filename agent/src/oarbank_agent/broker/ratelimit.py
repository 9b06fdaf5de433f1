"""A token bucket: the connect rate limit of one connector (contract section 3).

Pure decision logic: the caller passes the clock reading, so tests need no sleeping and the
broker decides with the loop's monotonic time.
"""

from __future__ import annotations

__all__ = ["TokenBucket"]


class TokenBucket:
    """``burst`` tokens to start with, refilled at ``rate_per_s`` up to ``burst``.

    ``take(now)`` spends one token and returns True, or returns False and leaves the bucket as
    it is; ``retry_after(now)`` says how many seconds until the next token.
    """

    def __init__(self, burst: int, rate_per_s: float, now: float) -> None:
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be positive, got {rate_per_s}")
        self.burst = burst
        self.rate_per_s = rate_per_s
        self._tokens = float(burst)
        self._stamp = now

    def _refill(self, now: float) -> None:
        # A clock that steps back (it should not: callers use a monotonic clock) refills nothing.
        elapsed = max(0.0, now - self._stamp)
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate_per_s)
        self._stamp = max(self._stamp, now)

    def take(self, now: float) -> bool:
        self._refill(now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def retry_after(self, now: float) -> float:
        self._refill(now)
        if self._tokens >= 1.0:
            return 0.0
        return (1.0 - self._tokens) / self.rate_per_s

    def tokens(self, now: float) -> float:
        self._refill(now)
        return self._tokens
