"""Time, injectable: the gate asks Redis for the time unless a clock pins it.

Production passes no clock, so every instance reads the Redis server's `TIME` inside the
Lua call and skewed hosts agree. Tests and the simulator pass a `ManualClock`.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Protocol

BEIJING = timezone(timedelta(hours=8), "Asia/Shanghai")  # China has no DST: a fixed offset is exact
MINUTE_MS = 60_000
MS_PER_DAY = 86_400_000
BEIJING_OFFSET_MS = 8 * 3_600_000  # the Lua's day rule uses the same offset (_common.lua)


class Clock(Protocol):
    def now_ms(self) -> int | None:
        """Milliseconds since the epoch, or None to let the store use its own clock."""


class ServerClock:
    """Use the store's clock (Redis `TIME`)."""

    def now_ms(self) -> int | None:
        return None


class SystemClock:
    """This host's clock; for processes that have no store time at hand."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)


class SkewAlarm:
    """Why the store's clock is not trusted now (None: it is). The sync thread sets it, the hook
    refuses while it is set; one per process."""

    def __init__(self) -> None:
        self.reason: str | None = None


SKEW = SkewAlarm()


class ManualClock:
    """A clock that only moves when told to. Thread-safe."""

    def __init__(self, start_ms: int) -> None:
        self._ms = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._ms

    def set(self, ms: int) -> None:
        with self._lock:
            if ms < self._ms:
                raise ValueError("a ManualClock never goes back")
            self._ms = ms

    def advance(self, ms: int) -> int:
        with self._lock:
            self._ms += ms
            return self._ms


def beijing_day(ms: int) -> int:
    """Index of the Beijing (Asia/Shanghai) calendar day holding `ms`; the Lua uses the same rule."""
    return (ms + BEIJING_OFFSET_MS) // MS_PER_DAY


def next_beijing_midnight_ms(ms: int) -> int:
    return (beijing_day(ms) + 1) * MS_PER_DAY - BEIJING_OFFSET_MS


def beijing_time_ms(day: int, at: str) -> int:
    """The instant of Beijing wall-clock time `at` (HH:MM) on Beijing `day`."""
    hours, minutes = (int(x) for x in at.split(":"))
    return day * MS_PER_DAY - BEIJING_OFFSET_MS + (hours * 60 + minutes) * MINUTE_MS


def to_beijing(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=BEIJING)
