"""The consume task's plan for one pool (docs/consume.md): which free tokens would expire unused, and
how many to use tonight so they don't. Pure: no I/O, no clock.

- Packages are drawn FIFO, oldest first. Every package lives the same 30 days, so expiry order
  is acquisition order. Usage we recorded that the API has not settled yet is drawn first.
- Natural usage is forecast as a steady rate (tokens per day). Drawn FIFO from now on, it leaves
  each package some *waste* at its expiry: what the pool would lose without the task.
- The task runs once a night. A package's waste must be used by the last run at least
  `lead_ms` before it expires. The lead is longer than a snapshot lives: the balance wall
  already takes off what expires within a snapshot's life (limit.py), so a package that close
  to its expiry can no longer be consumed — it is saved the night before.
- Each later night can use at most `capacity` (the collection cap less the forecast and
  SMALL_BUFFER), so tonight's need is the least that leaves every later night within it:
  `max over k of (waste due by run k − k × capacity)`. With no crunch that is exactly the
  waste of the packages that must be saved tonight.
- Tonight's plan is the need clamped by the room of both walls, each less SMALL_BUFFER, so
  consuming can neither bill (balance wall) nor burn (collection wall), and real users keep
  some room for the rest of the day.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .clock import MS_PER_DAY, to_beijing

MIN_LEAD_MS = 3_600_000  # a run this close to an expiry is too late to count on, whatever else
HISTORY_DAYS = 7  # the forecast is the median of this many recent days


@dataclass(frozen=True)
class Forecast:
    """Natural usage (the consume task's own excluded), tokens per Beijing day."""

    per_day: int
    source: str  # for the log line: where the number came from


@dataclass(frozen=True)
class PackageFate:
    """One package under the forecast: what it holds now and what it would lose at expiry."""

    instance_no: str
    expires_ms: int
    available: int  # now, with our unsettled usage drawn FIFO
    waste: int  # left at expiry if only natural usage draws on it
    due_run: int  # the run that must save it: 0 = this one, k = the k-th night after


@dataclass(frozen=True)
class ConsumePlan:
    pool: str
    now_ms: int
    tokens: int  # what to consume now
    need: int  # before the walls' clamps
    forecast: Forecast
    fates: tuple[PackageFate, ...]
    collection_room: int  # collection cap − today's usage − in-flight − SMALL_BUFFER
    balance_room: int  # balance wall − lifetime usage − in-flight − SMALL_BUFFER
    reason: str

    @property
    def waste(self) -> int:
        """Everything that would expire unused without the task (tonight and later)."""
        return sum(f.waste for f in self.fates)


def forecast_natural(history: Mapping[int, int], today: int, today_so_far: int,
                     day_fraction: float) -> Forecast:
    """Median natural usage of the last `HISTORY_DAYS` complete days; with no history, today's
    usage so far extrapolated (when a quarter of the day has passed), else zero.

    Erring low only makes the task consume a little more than strictly needed: those tokens
    come back the next day, while a forecast that errs high lets packages expire.
    """
    days = [history[d] for d in range(today - HISTORY_DAYS, today) if d in history]
    if days:
        return Forecast(int(statistics.median_low(days)), f"median of {len(days)} day(s)")
    if day_fraction >= 0.25:
        return Forecast(int(today_so_far / day_fraction), "today so far, extrapolated")
    return Forecast(0, "no history yet")


def _live(packages: Iterable[Mapping[str, Any]], now_ms: int) -> list[tuple[str, int, int]]:
    out = []
    for p in packages:
        expires, available = p.get("expires_ms"), int(p.get("available") or 0)
        if expires is None or int(expires) <= now_ms or available <= 0:
            continue  # no expiry: never wasted; past expiry: gone (the snapshot predates it)
        out.append((str(p.get("instance_no", "?")), int(expires), available))
    return sorted(out, key=lambda t: (t[1], t[0]))


def package_fates(packages: Iterable[Mapping[str, Any]], *, now_ms: int, unsettled: int,
                  per_day: int, next_run_ms: int, lead_ms: int = MIN_LEAD_MS) -> list[PackageFate]:
    """Each live package's waste under the forecast, FIFO, and the run that must save it."""
    live = _live(packages, now_ms)
    left = [a for _, _, a in live]
    owed = max(0, unsettled)
    for i in range(len(left)):  # usage already made but not yet in the API's numbers
        take = min(owed, left[i])
        left[i] -= take
        owed -= take
    available = list(left)
    fates = []
    t = now_ms
    for i, (instance, expires, _) in enumerate(live):
        demand = per_day * max(0, expires - t) // MS_PER_DAY
        for j in range(i, len(left)):
            if demand <= 0:
                break
            take = min(demand, left[j])
            left[j] -= take
            demand -= take
        waste, left[i] = left[i], 0
        t = max(t, expires)
        lead = max(lead_ms, MIN_LEAD_MS)
        runs_in_time = 0 if next_run_ms + lead > expires else \
            1 + (expires - lead - next_run_ms) // MS_PER_DAY
        fates.append(PackageFate(instance, expires, available[i], waste, int(runs_in_time)))
    return fates


def tonight_need(fates: Sequence[PackageFate], capacity: int) -> int:
    """The least tonight can consume and still leave each later night within `capacity`."""
    need = 0
    due = 0
    for k in range(0, max((f.due_run for f in fates), default=-1) + 1):
        due += sum(f.waste for f in fates if f.due_run == k)
        need = max(need, due - k * max(0, capacity))
    return need


def plan_pool(*, pool: str, now_ms: int, packages: Iterable[Mapping[str, Any]], unsettled: int,
              forecast: Forecast, next_run_ms: int, daily_cap: int, small_buffer: int,
              collection_room: int, balance_room: int, lead_ms: int = MIN_LEAD_MS) -> ConsumePlan:
    """The plan for one pool now; the rooms are the gate's, already less SMALL_BUFFER."""
    fates = package_fates(packages, now_ms=now_ms, unsettled=unsettled,
                          per_day=forecast.per_day, next_run_ms=next_run_ms, lead_ms=lead_ms)
    capacity = daily_cap - forecast.per_day - small_buffer
    need = tonight_need(fates, capacity)
    tokens = max(0, min(need, collection_room, balance_room))
    reason = _reason(fates, need, tokens, forecast, collection_room, balance_room)
    return ConsumePlan(pool, now_ms, tokens, need, forecast, tuple(fates), collection_room,
                       balance_room, reason)


def _when(ms: int) -> str:
    return f"{to_beijing(ms):%m-%d %H:%M}"


def _reason(fates: Sequence[PackageFate], need: int, tokens: int, forecast: Forecast,
            collection_room: int, balance_room: int) -> str:
    usage = f"forecast {forecast.per_day:,}/day ({forecast.source})"
    if not fates:
        return f"no free package with an expiry; {usage}"
    wasted = [f for f in fates if f.waste > 0]
    if need == 0:
        later = f"; {sum(f.waste for f in wasted):,} would expire later, for later nights" \
            if wasted else ""
        return f"nothing needs saving tonight: {usage} uses every package before it expires{later}"
    tonight = [f for f in wasted if f.due_run == 0]
    parts = [f"{f.instance_no} expires {_when(f.expires_ms)} with ~{f.waste:,} unused"
             for f in tonight[:3]]
    if len(tonight) > 3:
        parts.append(f"{len(tonight) - 3} more")
    ahead = need - sum(f.waste for f in tonight)
    if ahead > 0:
        parts.append(f"{ahead:,} ahead of later nights (one night cannot save them all)")
    why = "; ".join(parts) + f"; {usage}"
    if tokens < need:
        wall = "collection" if collection_room <= balance_room else "balance"
        why += (f"; clamped by the {wall} wall (room {min(collection_room, balance_room):,} "
                f"after SMALL_BUFFER): {need - tokens:,} will expire")
    return why
