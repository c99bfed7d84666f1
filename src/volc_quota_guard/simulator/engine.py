"""The discrete-event loop: one scenario, one strategy, one fresh ledger, in Beijing time.

Events, in time order (at equal times: the end of a Beijing day, settles, then the strategy's
sync, then samples, then arrivals, then a wipe of the strategy's store, then a crash of its
process): a request *arrives* (the
strategy admits it, maybe with a clamped output cap, or refuses it), runs `duration_seconds`, then
*settles*: the ledger consumes its true tokens at that instant (billing what exceeds the true free
balance) and the strategy records the usage the upstream reported. The ledger applies return
packages and expiries lazily, in order. A scenario's `prior_usage` is consumed on the ledger
before the start.
"""

from __future__ import annotations

import heapq
import math
import time
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from ..clock import MINUTE_MS, ManualClock, beijing_day, next_beijing_midnight_ms
from ..config import Settings, load_settings
from ..fake.ledger import Ledger
from .scenario import Scenario, arrivals
from .strategies import (
    POOL,
    STRATEGIES,
    Admission,
    GuardStrategy,
    HistoricalStrategy,
    SimRequest,
    Strategy,
    sync_logs,
)

RESULT_KEYS = ("scenario", "strategy", "billed_tokens", "burned_tokens", "expired_tokens",
               "served_requests", "blocked_requests", "clamped_requests", "served_tokens",
               "refused_while_free_tokens")
EXPIRY_DAYS = 30


class _ScenarioSettings(Settings):
    """Settings from their defaults and the scenario only: the run does not depend on the env."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def guard_settings(scenario: Scenario, *, from_env: bool = False) -> Settings:
    """The guard's settings for a run: production defaults (or VQG_* with `from_env`), with the
    scenario's SMALL_BUFFER, daily cap and sync interval (and unseen bound, where it sets one)."""
    own: dict[str, Any] = {"small_buffer": scenario.small_buffer, "daily_cap": scenario.daily_cap,
                           "sync_interval_minutes": scenario.sync_interval_minutes}
    if scenario.unseen_day_tokens is not None:
        own["unseen_day_tokens"] = scenario.unseen_day_tokens
    return load_settings(**own) if from_env else _ScenarioSettings(**own)


@dataclass
class Series:
    """What a plot shows, sampled every `step_ms` (plus each block and bill as it happens)."""

    step_ms: int
    daily_cap: int
    t: list[int] = field(default_factory=list)
    true_balance: list[int] = field(default_factory=list)
    api_balance: list[int] = field(default_factory=list)
    usage_today: list[int] = field(default_factory=list)
    limit_today: list[int] = field(default_factory=list)
    billed: list[int] = field(default_factory=list)  # cumulative
    blocked_at: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class RunResult:
    scenario: str
    strategy: str
    billed_tokens: int
    burned_tokens: int
    expired_tokens: int
    served_requests: int
    blocked_requests: int
    clamped_requests: int
    served_tokens: int
    refused_while_free_tokens: int
    stranded_tokens: int = 0  # refused-while-free demand the day's leftover free quota could have served
    # Of those, what a history start cost: refused while the pool was held or its day's cap
    # lowered for usage the guard did not see (a first start, a wipe: docs/limit.md), and the
    # stranded quota of such days in the same share.
    refused_at_start_tokens: int = 0
    stranded_at_start_tokens: int = 0
    # Of refused_while_free: what also fit beyond SMALL_BUFFER (the reserve stranded leaves out).
    refused_beyond_buffer_tokens: int = 0
    syncs: int = 0
    elapsed_s: float = 0.0
    series: Series | None = None

    def as_json(self) -> dict[str, Any]:
        """The output object of docs/simulator.md: exactly these keys, in this order."""
        return {k: getattr(self, k) for k in RESULT_KEYS}


def make_ledger(s: Scenario) -> Ledger:
    ledger = Ledger(daily_cap=s.daily_cap, return_at=None, lag_minutes=s.settlement_lag_minutes,
                    expiry_days=EXPIRY_DAYS)
    if s.return_at is not None:  # the ledger takes "HH:MM"; ours may carry seconds
        ledger.return_offset_ms = s.return_at
    ledger.ensure_pool(POOL)
    for p in s.packages:
        acquired = int(p.acquired.timestamp() * 1000)
        expires = None if p.expires is None else int(p.expires.timestamp() * 1000)
        ledger.add_package(POOL, p.amount, acquired, expires_ms=expires)
    if s.yesterday_collection:
        ledger.set_collection(POOL, beijing_day(s.start_ms) - 1, s.yesterday_collection)
    if s.prior_usage is not None:  # the old setup's usage, straight on Ark: the guard never sees it
        minutes = max(1, math.ceil(s.prior_usage.minutes))
        span = round(s.prior_usage.minutes * MINUTE_MS)
        for i in range(minutes):
            share = s.prior_usage.tokens * (i + 1) // minutes - s.prior_usage.tokens * i // minutes
            ledger.consume(POOL, share, s.start_ms - span + span * i // minutes - (0 if span else 1))
    return ledger


def make_strategy(name: str, s: Scenario, ledger: Ledger, clock: ManualClock, cfg: Settings,
                  errors: Any, store_url: str | None = None) -> Strategy:
    if name == "guard":
        return GuardStrategy(s, ledger, clock, cfg, errors, store_url)
    if name in STRATEGIES:
        return HistoricalStrategy(name, s, ledger)
    raise ValueError(f"unknown strategy {name!r}; one of {', '.join(STRATEGIES)}")


_LAG, _DAY_END, _SETTLE, _WAKE, _SAMPLE, _ARRIVE, _WIPE, _CRASH, _GIVE_UP = range(9)
_NEVER = 1 << 62


def simulate(s: Scenario, strategy: str = "guard", *, series: bool = False,
             sample_minutes: int | None = None, from_env: bool = False,
             verbose: bool = False, store_url: str | None = None) -> RunResult:
    """Run one scenario under one strategy; deterministic for a given scenario and settings.

    The guard runs on a fresh embedded store, or on the Redis server at `store_url` (several
    times faster) under a key prefix of its own, deleted afterwards.
    """
    started = time.perf_counter()
    clock = ManualClock(s.start_ms)
    ledger = make_ledger(s)
    cfg = guard_settings(s, from_env=from_env)
    end = s.end_ms
    step = (sample_minutes or (5 if s.days <= 3 else 30)) * MINUTE_MS
    out = Series(step, s.daily_cap) if series else None

    served = blocked = clamped = served_tokens = refused_free = stranded = 0
    refused_start = stranded_start = refused_beyond = 0
    next_midnight = next_beijing_midnight_ms(s.start_ms)
    pending = 0  # true tokens of admitted requests that have not settled yet
    spared: dict[int, int] = {}  # Beijing day -> refused tokens counted as would-have-fit
    spared_start: dict[int, int] = {}  # of those, refused while the history was starting

    def day_stranded(at: int) -> tuple[int, int]:
        day = beijing_day(at - 1)
        left = _stranded(ledger, s, at, pending, spared.get(day, 0))
        return left, left * spared_start.get(day, 0) // max(1, spared.get(day, 0))
    settles: list[tuple[int, int, SimRequest, Admission, int]] = []
    seq = 0
    todo = list(arrivals(s))
    next_arrival = 0
    next_sample = s.start_ms if out else _NEVER
    wipe_at = s.wipe_ms if s.wipe_ms is not None else _NEVER
    crash_at = s.crash_ms if s.crash_ms is not None else _NEVER
    orphans: set[int] = set()  # requests whose process died: Ark bills them, no one settles them
    give_ups: list[tuple[int, int, SimRequest, Admission]] = []  # the proxy stops waiting
    lag_changes = s.lag_schedule()

    with sync_logs(verbose) as errors, closing(make_strategy(strategy, s, ledger, clock, cfg, errors,
                                                             store_url)) as strat:
        strat.start(s.start_ms)
        while True:
            wake = strat.wakeup_at()
            candidates = (
                (lag_changes[0][0] if lag_changes else _NEVER, _LAG),
                (next_midnight if next_midnight < end else _NEVER, _DAY_END),
                (settles[0][0] if settles else _NEVER, _SETTLE),
                (wake if wake is not None and wake < end else _NEVER, _WAKE),
                (next_sample if next_sample < end else _NEVER, _SAMPLE),
                (todo[next_arrival].at_ms if next_arrival < len(todo) else _NEVER, _ARRIVE),
                (wipe_at, _WIPE),
                (crash_at, _CRASH),
                (give_ups[0][0] if give_ups else _NEVER, _GIVE_UP),
            )
            now, kind = min(candidates)
            if now >= _NEVER:
                break
            clock.set(now)

            if kind == _LAG:
                ledger.set_lag(lag_changes.pop(0)[1], now)
            elif kind == _DAY_END:
                left, at_start = day_stranded(now)
                stranded += left
                stranded_start += at_start
                next_midnight = next_beijing_midnight_ms(now)
            elif kind == _SETTLE:
                _, n, req, adm, tokens = heapq.heappop(settles)
                ledger.consume(POOL, tokens, now)
                pending -= tokens
                served += 1
                served_tokens += tokens
                if n not in orphans:
                    strat.settle(req, adm, None if req.line.usage == "missing" else tokens, now)
            elif kind == _WAKE:
                strat.wake(now)
            elif kind == _WIPE:
                strat.wipe(now)
                wipe_at = _NEVER
            elif kind == _GIVE_UP:
                _, n, req, adm = heapq.heappop(give_ups)
                if n not in orphans:
                    orphans.add(n)  # Ark goes on and bills it at its end; no settle comes then
                    strat.give_up(req, adm, now)
            elif kind == _CRASH:
                orphans.update(n for _, n, _, _, _ in settles)  # the guard's deadlines stop there
                crash_at = _NEVER
            elif kind == _SAMPLE:
                assert out is not None
                totals = ledger.totals(POOL, now)
                view = strat.view(now)
                out.t.append(now)
                out.true_balance.append(totals.true_balance)
                out.api_balance.append(totals.api_balance)
                out.usage_today.append(view.usage_today)
                out.limit_today.append(view.limit_today)
                out.billed.append(totals.billed)
                next_sample += step
            else:
                arrival = todo[next_arrival]
                next_arrival += 1
                line = s.traffic[arrival.line]
                for _ in range(arrival.count):
                    seq += 1
                    req = SimRequest(f"req-{seq}", now, line, line.estimate())
                    adm = strat.admit(req, now)
                    if not adm.admitted:
                        blocked += 1
                        if out is not None:
                            out.blocked_at.append(now)
                        would = line.billed_prompt + line.made(strat.full_output(line),
                                                        getattr(strat, "caps_total", False))
                        day = beijing_day(now)
                        if _fits(ledger, s, now, would, pending + spared.get(day, 0)):
                            refused_free += would
                            if _fits(ledger, s, now, would, pending + spared.get(day, 0), s.small_buffer):
                                refused_beyond += would
                            spared[day] = spared.get(day, 0) + would
                            if strat.starting(now):
                                refused_start += would
                                spared_start[day] = spared_start.get(day, 0) + would
                        continue
                    clamped += adm.clamped
                    tokens = line.billed_prompt + line.made(adm.output_cap, adm.caps_total)
                    pending += tokens
                    done = now + round(line.duration_seconds * 1000)
                    heapq.heappush(settles, (done, seq, req, adm, tokens))
                    quit_s = line.gives_up_after_seconds
                    if quit_s is not None and quit_s < line.duration_seconds:
                        heapq.heappush(give_ups, (now + round(quit_s * 1000), seq, req, adm))

        final = max(end, clock.now_ms())
        left, at_start = day_stranded(final)
        stranded += left
        stranded_start += at_start
        totals = ledger.totals(POOL, final)
    return RunResult(
        scenario=s.name, strategy=strategy, billed_tokens=totals.billed,
        burned_tokens=totals.burned, expired_tokens=totals.expired, served_requests=served,
        blocked_requests=blocked, clamped_requests=clamped, served_tokens=served_tokens,
        refused_while_free_tokens=refused_free, stranded_tokens=stranded,
        refused_at_start_tokens=refused_start, stranded_at_start_tokens=stranded_start,
        refused_beyond_buffer_tokens=refused_beyond, syncs=strat.syncs,
        elapsed_s=time.perf_counter() - started, series=out)


def _stranded(ledger: Ledger, s: Scenario, end: int, pending: int, refused_free: int) -> int:
    """At the end (ms) of a Beijing day: the free quota it left unused beyond SMALL_BUFFER (the
    true free balance or the day's remaining cap, whichever binds), up to the tokens it refused
    while they fit. Quota no request asked for is not stranded; quota a refusal left is."""
    if refused_free <= 0:
        return 0
    totals = ledger.totals(POOL, end)
    collected = totals.collected.get(beijing_day(end - 1), 0)
    usable = min(totals.true_balance - pending, s.daily_cap - collected)
    return min(refused_free, max(0, usable - s.small_buffer))


def _fits(ledger: Ledger, s: Scenario, now: int, tokens: int, pending: int, reserve: int = 0) -> bool:
    """Would `tokens` more have stayed within the true free balance (less `reserve`) and today's cap?

    `pending` counts in-flight requests and the refused tokens of today already counted as
    fitting (as if they had run), so a run of refusals is not counted past what was free.
    """
    totals = ledger.totals(POOL, now)
    return (tokens <= totals.true_balance - pending - reserve
            and totals.collected_today + pending + tokens <= s.daily_cap)


def run_all(s: Scenario, strategies: list[str], **kwargs: Any) -> list[RunResult]:
    return [simulate(s, name, **kwargs) for name in strategies]
