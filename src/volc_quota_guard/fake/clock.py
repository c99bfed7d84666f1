"""A clock for the fake Volcengine that runs faster than real time (a day in minutes)."""

from __future__ import annotations

import threading
import time


class ScaledClock:
    """``now = start_ms + elapsed_real_time * scale (+ jumps)``. Thread-safe, never goes back."""

    def __init__(self, start_ms: int | None = None, scale: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError("scale must be > 0")
        self.scale = scale
        self._start_ms = int(time.time() * 1000) if start_ms is None else start_ms
        self._t0 = time.monotonic()
        self._jump_ms = 0
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            elapsed = (time.monotonic() - self._t0) * 1000 * self.scale
            return self._start_ms + int(elapsed) + self._jump_ms

    def advance(self, ms: int) -> int:
        if ms < 0:
            raise ValueError("a ScaledClock never goes back")
        with self._lock:
            self._jump_ms += ms
        return self.now_ms()

    def set(self, ms: int) -> None:
        now = self.now_ms()
        if ms < now:
            raise ValueError("a ScaledClock never goes back")
        self.advance(ms - now)
