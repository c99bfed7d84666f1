"""What decides, in a simulation, whether a request may run: the guard or a historical formula.

`GuardStrategy` drives the production code — `Gate` (reserve with clamp, settle) and
`SyncService.tick()` fed by the fake ledger's lagged API view — on a fresh embedded store through a
`ManualClock`. Nothing of the guard is re-implemented here: only the hook's arithmetic around
the gate (what to reserve, how a grant becomes the upstream's `max_tokens`).

`HistoricalStrategy` is the seed's pre-guard code (docs/simulator.md, "What runs"), small on purpose:
today's usage (Beijing day, counted when a request succeeds) against a limit recomputed at each
sync from the API's balance, no in-flight accounting, no clamp.
"""

from __future__ import annotations

import heapq
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

import fakeredis

from .. import admission
from ..clock import MINUTE_MS, ManualClock, beijing_day
from ..config import MIN_OUTPUT_TOKENS, Settings
from ..errors import GateError
from ..fake.ledger import Ledger
from ..gate import Gate
from ..gate.keys import KeySpace
from ..gate.scripts import forget_sightings
from ..gate.store import connect
from ..limit import LimitResult, LimitState
from ..sync import BURST_SPACING_MS, SyncService
from ..volcengine.billing import ResourcePackage
from ..volcengine.packages import PoolSpec
from .scenario import Scenario, TrafficLine

ACCOUNT = "sim"
MODEL = "deepseek-v4-flash-ga-260731"  # the seed's model; the ledger names its packages after it
POOL = f"{ACCOUNT}/{MODEL}"

# The hook's clamp: a request that does not fit is still admitted with a smaller output cap,
# down to this many output tokens; below that it is refused (docs/gate.md). Equal to
POLL_MS = 5_000  # the sync thread polls every 5 s (SyncService.start)

# The historical code's constants (docs/simulator.md).
HISTORICAL_BUFFER = 300_000  # v2 / v4 / v5 BUFFER
PREBLOCK_RESERVE_TOKENS = 50_000  # reserve when a request has no max_tokens
BURST_SYNC_TOKENS = 100_000  # a sync right after this much usage since the last one
LOW_REMAINING = 300_000  # below this much left, sync every LOW_INTERVAL
LOW_INTERVAL_MS = 5 * MINUTE_MS

STRATEGIES = ("guard", "v2", "v4", "v5", "v6")


@dataclass(frozen=True)
class SimRequest:
    rid: str
    start_ms: int
    line: TrafficLine
    estimate: int  # the tokenizer's count of the prompt


@dataclass(frozen=True)
class Admission:
    admitted: bool
    output_cap: int | None = None  # the upstream's cap per choice (None: the model's own limit)
    caps_total: bool = False  # the cap bounds answer + reasoning (max_completion_tokens)
    clamped: bool = False
    reason: str = ""


@dataclass(frozen=True)
class LimitView:
    """A strategy's picture of today, for plots: usage so far and what it may reach."""

    usage_today: int
    limit_today: int


class Strategy(Protocol):
    name: str

    def start(self, now: int) -> None: ...

    def admit(self, req: SimRequest, now: int) -> Admission: ...

    def settle(self, req: SimRequest, adm: Admission, reported: int | None, now: int) -> None: ...

    def give_up(self, req: SimRequest, adm: Admission, now: int) -> None:
        """The proxy gave up on an admitted request that Ark goes on running."""

    def wakeup_at(self) -> int | None:
        """When the strategy's background work (its sync) next wants to run."""

    def wake(self, now: int) -> None: ...

    def wipe(self, now: int) -> None:
        """The strategy's store loses all its data (a Redis restarted without persistence)."""

    def full_output(self, line: TrafficLine) -> int | None:
        """The output cap a request would get if admitted without a clamp (None: uncapped)."""

    def view(self, now: int) -> LimitView: ...

    def starting(self, now: int) -> bool:
        """Whether the strategy's history of the pool is starting: the pool held, or today's
        cap lowered for usage it did not see (a first start, lost state; docs/limit.md)."""

    def close(self) -> None:
        """Drop what the run stored."""

    @property
    def syncs(self) -> int: ...


# ---------------------------------------------------------------------- the guard


class LedgerLister:
    """`ListResourcePackages` of one account, answered in-process from the ledger's lagged view."""

    def __init__(self, ledger: Ledger, account: str, clock: ManualClock) -> None:
        self.ledger = ledger
        self.account = account
        self.clock = clock
        self.calls = 0

    def list_resource_packages(self) -> list[ResourcePackage]:
        self.calls += 1
        now = self.clock.now_ms()
        return [
            ResourcePackage(
                instance_no=v.instance_no, product=v.product, product_name=v.product_name,
                configuration_code=v.configuration_code, configuration_name=v.configuration_name,
                unit=v.unit, total=v.total, available=v.available, status=v.status,
                effective_ms=v.acquired_ms, expires_ms=v.expires_ms)
            for pool in self.ledger.pools() if pool.split("/", 1)[0] == self.account
            for v in self.ledger.api_view(pool, now)
        ]


class SimulationError(RuntimeError):
    """The production code failed inside a simulation (a bug to report, not a scenario error)."""


class _SyncErrors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, "vqg_billing", False):  # billing is the run's result, not a failure
            self.records.append(record)


@contextmanager
def sync_logs(verbose: bool) -> Iterator[_SyncErrors]:
    """Quiet the sync's per-sync INFO lines (unless verbose) and catch its ERROR lines."""
    logger = logging.getLogger("volc_quota_guard.sync")
    errors = _SyncErrors()
    old_level, old_propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO if verbose else logging.ERROR)
    logger.propagate = verbose
    logger.addHandler(errors)
    try:
        yield errors
    finally:
        logger.removeHandler(errors)
        logger.setLevel(old_level)
        logger.propagate = old_propagate


class GuardStrategy:
    """The production gate + limit + sync on a fresh embedded store and a manual clock."""

    name = "guard"

    def __init__(self, scenario: Scenario, ledger: Ledger, clock: ManualClock, cfg: Settings,
                 errors: _SyncErrors, store_url: str | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.scenario = scenario
        # A fresh embedded store, or a Redis server (faster) under a prefix of this run's own.
        self.store_url = store_url
        client = connect(store_url, single_thread=True) if store_url else fakeredis.FakeRedis(
            server=fakeredis.FakeServer())
        # A prefix of its own on either store: this process's gate answers are kept per prefix
        # (`Gate.sighting`), and another run's must not be read as this one's.
        self.gate = Gate(client, KeySpace(f"sim-{uuid.uuid4().hex[:12]}"), clock)
        self.lister = LedgerLister(ledger, ACCOUNT, clock)
        self.sync = SyncService(cfg, self.gate, pools=lambda: [PoolSpec(POOL)],
                                lister_for=lambda account: self.lister)
        self._errors = errors
        self._origin = scenario.start_ms
        self._wipe_ms = scenario.wipe_ms
        self._wakeups: list[int] = []
        self._queued: set[int] = set()
        self.sync_results: list[tuple[int, LimitResult]] = []
        self._usage_at_sync = 0
        self._last_at = 0

    @property
    def syncs(self) -> int:
        return self.lister.calls

    def close(self) -> None:
        forget_sightings(self.gate.args.keyspace)
        if self.store_url:
            try:
                self.gate.records.clear()
            finally:
                self.gate.client.close()  # its one connection (a fuzz run builds hundreds)

    # -- the sync thread --------------------------------------------------------------------
    def _poll_at(self, ms: int) -> int:
        """The first poll of the sync thread at or after `ms` (it polls every POLL_MS)."""
        return self._origin + -(-(ms - self._origin) // POLL_MS) * POLL_MS

    def _schedule(self, ms: int) -> None:
        at = self._poll_at(ms)
        if at not in self._queued:
            self._queued.add(at)
            heapq.heappush(self._wakeups, at)

    def start(self, now: int) -> None:
        self._schedule(now)
        if self._wipe_ms is not None:  # the thread's last poll before the wipe (it polls anyway)
            at = self._origin + (self._wipe_ms - self._origin) // POLL_MS * POLL_MS
            if at not in self._queued:
                self._queued.add(at)
                heapq.heappush(self._wakeups, at)

    def wakeup_at(self) -> int | None:
        return self._wakeups[0] if self._wakeups else None

    def wipe(self, now: int) -> None:
        """Every key of the run goes, as in a `FLUSHALL`; the sync thread polls on as before."""
        self.gate.records.clear()
        self._usage_at_sync = self._last_at = 0
        self._schedule(now)

    def wake(self, now: int) -> None:
        while self._wakeups and self._wakeups[0] <= now:
            self._queued.discard(heapq.heappop(self._wakeups))
        for outcome in self.sync.tick():
            self.sync_results += [(now, r) for r in outcome.results]
        if self._errors.records:
            record = self._errors.records[0]
            raise SimulationError(f"the sync failed at {now}: {record.getMessage()}")
        meta = self.gate.records.sync_meta(ACCOUNT)
        self._usage_at_sync = int(meta.get("usage_total", 0))
        self._last_at = int(meta.get("last_at", 0))
        self._schedule(max(now + 1, int(meta.get("next_at", now + 1))))

    def _burst_pending(self, usage: int, now: int) -> None:
        """Poll when the sync's burst rule could fire (`SyncService.due` decides)."""
        if usage - self._usage_at_sync >= self.cfg.burst_tokens:
            self._schedule(max(now, self._last_at + BURST_SPACING_MS))

    # -- the hook ---------------------------------------------------------------------------
    caps_total = True  # the hook pins max_completion_tokens

    def _need(self, req: SimRequest) -> admission.Sizing:
        limits = admission.Limits(model_max_output=None, default_output=self.cfg.default_output_tokens,
                                  reasoning_tokens=self.scenario.model_reasoning_tokens,
                                  min_output=MIN_OUTPUT_TOKENS)
        line = req.line
        return admission.sizing(req.estimate, answer_cap=line.max_tokens, total_cap=None,
                                thinking=line.thinking, n=line.n, limits=limits)

    def full_output(self, line: TrafficLine) -> int | None:
        return self._need(SimRequest("", 0, line, line.estimate())).per_choice

    def admit(self, req: SimRequest, now: int) -> Admission:
        need = self._need(req)  # the hook's rule (admission.sizing), on the line's numbers
        # The hook renews a running request's deadline a TTL ahead every third of one, up to
        # the longest call it lets run (`Settings.longest_call_ms`): the reservation outlives its
        # request.
        ttl_s = self.cfg.reservation_ttl_seconds
        ttl_ms = 1000 * ttl_s + min(round(1000 * req.line.duration_seconds),
                                    self.cfg.longest_call_ms() - 1000 * ttl_s)
        crash = self.scenario.crash_ms
        if crash is not None and now <= crash < now + req.line.duration_seconds * 1000:
            # Its process dies while it runs: the deadline stays where the last renewal before
            # the crash put it, and the reservation expires there.
            every = ttl_s * 1000 // 3
            ttl_ms = min(ttl_ms, (crash - now) // every * every + ttl_s * 1000)
        exact = req.line.counting == "exact"
        run_ms = self.cfg.call_run_ms(self.cfg.max_call_seconds, need.output)  # as the hook
        if req.line.counting == "ark-api" and need.input_tokens >= self.cfg.exact_count_min_tokens:
            need, exact = self._need(replace(req, estimate=req.line.exact_estimate())), True
        d = self.gate.reserve(POOL, req.rid, need.wanted, need.least, ttl_ms=ttl_ms,
                              input_tokens=need.input_tokens, exact=exact, run_ms=run_ms)
        if req.line.counting == "ark-api" and not exact and d.refused_at_wall:
            # The hook's Doubao path (docs/counting.md): a big prompt, or one whose cheap count
            # does not fit, is counted by Ark's tokenization API and reserved in the exact class
            # (a refusal wrote nothing, so it is asked again).
            need = self._need(replace(req, estimate=req.line.exact_estimate()))
            d = self.gate.reserve(POOL, req.rid, need.wanted, need.least, ttl_ms=ttl_ms,
                                  input_tokens=need.input_tokens, exact=True, run_ms=run_ms)
        if not d.admitted:
            return Admission(False, reason=d.reason)
        out = need.granted_per_choice(d)  # the per-choice cap the hook pins
        return Admission(True, output_cap=out, caps_total=True, clamped=out < need.per_choice,
                         reason=d.reason)

    def settle(self, req: SimRequest, adm: Admission, reported: int | None, now: int) -> None:
        # The upstream reports the true prompt tokens: the pool's estimate correction learns.
        try:
            # As the hook: a call of several choices does not teach k (its prompt is read n times).
            measured = None if reported is None or req.line.n > 1 else req.line.prompt
            d = self.gate.settle(POOL, req.rid, reported, measured)
        except GateError as exc:
            if exc.code != "unknown_pool":
                raise
            return  # the store was wiped and no sync has recreated the pool yet: the usage is lost
        self._burst_pending(d.used_balance - d.inflight, now)

    def give_up(self, req: SimRequest, adm: Admission, now: int) -> None:
        # As the hook on a timeout or a client leaving: kept whole, Ark may still be running it.
        try:
            d = self.gate.settle(POOL, req.rid, None, running=True)
        except GateError as exc:
            if exc.code != "unknown_pool":
                raise
            return
        self._burst_pending(d.used_balance - d.inflight, now)

    def view(self, now: int) -> LimitView:
        d = self.gate.status(POOL).decision
        if d.reason == "no_snapshot":
            return LimitView(0, 0)
        return LimitView(d.used_today, d.used_today + max(d.headroom, 0))

    def starting(self, now: int) -> bool:
        field = partial(self.gate.records.state_int, POOL)
        if not field("snap_at") or field("hold_until") > now:  # no state yet (a wipe), or held
            return True
        if field("day_margin") > 0 and field("day_lost") == beijing_day(now):
            return True
        # Young: the unseen bound is kept off the balance wall (limit.py)
        return LimitState.from_json(self.gate.records.limit_state(POOL)).unseen_ref is not None


# ---------------------------------------------------------------------- the seed's formulas


class HistoricalStrategy:
    """v2 / v5: min(cap, usage + balance − 300,000); v4: min(cap, balance − 300,000);
    v6: min(cap, balance_at_sync + usage_at_sync − SMALL_BUFFER) with reserve = estimated input +
    max_tokens and post-call soft-evict. Usage is today's, counted at success (0 when the
    upstream omits usage); the check is ``usage + reserve >= limit → 429``."""

    def __init__(self, name: str, scenario: Scenario, ledger: Ledger) -> None:
        if name not in ("v2", "v4", "v5", "v6"):
            raise ValueError(f"unknown historical strategy {name!r}")
        self.name = name
        self.ledger = ledger
        self.cap = scenario.daily_cap
        self.small_buffer = scenario.small_buffer
        self.interval_ms = scenario.sync_interval_minutes * MINUTE_MS
        self.usage: dict[int, int] = {}  # Beijing day -> usage counted
        self.limit = 0
        self.next_sync: int | None = None
        self.since_sync = 0
        self.evicted = False
        self._syncs = 0

    @property
    def syncs(self) -> int:
        return self._syncs

    def today(self, now: int) -> int:
        return self.usage.get(beijing_day(now), 0)

    def formula(self, balance: int, usage: int) -> int:
        if self.name in ("v2", "v5"):
            stable = usage + balance - HISTORICAL_BUFFER
            return min(self.cap, max(0, stable) if self.name == "v5" else stable)
        if self.name == "v4":
            return min(self.cap, max(0, balance - HISTORICAL_BUFFER))
        return min(self.cap, balance + usage - self.small_buffer)

    def sync(self, now: int) -> None:
        self._syncs += 1
        usage = self.today(now)
        self.limit = self.formula(self.ledger.api_balance(POOL, now), usage)
        self.since_sync = 0
        if self.evicted and usage < self.limit:
            self.evicted = False  # the deployment is renamed back
        low = self.limit - usage < LOW_REMAINING
        self.next_sync = now + (min(self.interval_ms, LOW_INTERVAL_MS) if low else self.interval_ms)

    def start(self, now: int) -> None:
        self.sync(now)

    def wakeup_at(self) -> int | None:
        return self.next_sync

    def wake(self, now: int) -> None:
        self.sync(now)

    def wipe(self, now: int) -> None:
        pass  # the seed's formulas kept their day's usage in the process

    def full_output(self, line: TrafficLine) -> int | None:
        return line.max_tokens

    def reserve(self, req: SimRequest) -> int:
        asked = req.line.max_tokens or PREBLOCK_RESERVE_TOKENS
        return req.estimate + asked if self.name == "v6" else asked

    def admit(self, req: SimRequest, now: int) -> Admission:
        if self.evicted:
            return Admission(False, reason="evicted")
        if self.today(now) + self.reserve(req) >= self.limit:
            return Admission(False, reason="limit")
        return Admission(True, output_cap=req.line.max_tokens)

    def settle(self, req: SimRequest, adm: Admission, reported: int | None, now: int) -> None:
        counted = reported or 0
        day = beijing_day(now)
        self.usage[day] = self.usage.get(day, 0) + counted
        self.since_sync += counted
        if self.name == "v6" and self.usage[day] >= self.limit:
            self.evicted = True
        if self.since_sync > BURST_SYNC_TOKENS:
            self.sync(now)

    def give_up(self, req: SimRequest, adm: Admission, now: int) -> None:
        self.settle(req, adm, None, now)  # no usage comes back

    def view(self, now: int) -> LimitView:
        return LimitView(self.today(now), self.limit)

    def starting(self, now: int) -> bool:
        return False

    def close(self) -> None:
        pass
