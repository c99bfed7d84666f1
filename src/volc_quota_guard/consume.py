"""The nightly consume task (docs/consume.md): use free tokens that would otherwise expire.

From `VQG_CONSUME_AT` (Beijing time) each pool is handled once per Beijing day: a Redis key set
with NX claims the day, so however many proxy instances run the task, one of them consumes.
The plan (`consume_plan.py`) comes from the pool's snapshot and the natural-usage history kept
here. Each call goes straight to Ark with the deployment's key (`ark.py`), sized so it cannot
use more than is left of the plan nor come within SMALL_BUFFER of a wall, and is reserved and
settled in the gate like any proxied request — so the walls count it at once, concurrent
users cannot spend the same headroom, and a crash mid-call leaves it counted as consumed.
The run stops when the plan is met, a wall comes near, the day ends, or calls keep failing.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace

from . import admission, counting
from .clock import MS_PER_DAY, SKEW, SkewAlarm, beijing_day, beijing_time_ms, next_beijing_midnight_ms
from .config import Settings
from .consume_plan import ConsumePlan, forecast_natural, plan_pool
from .errors import ArkCallError, QuotaGuardError, StoreUnavailable
from .gate import PPM, Gate, PoolState
from .volcengine.ark import ArkChat, ArkTarget, consume_messages

log = logging.getLogger("volc_quota_guard.consume")
# The consume call's body caps answer + reasoning itself (max_completion_tokens): no allowance.
_CONSUME_LIMITS = admission.Limits(model_max_output=None, default_output=1, reasoning_tokens=0,
                                   min_output=1)

TAG = "🍽️ [CONSUME]"
CLAIM_MS = 2 * MS_PER_DAY  # the day's claim outlives the day
HISTORY_KEEP_DAYS = 30
RUN_MS = 3_600_000  # how long a run may take: a package must not enter the wall's expiry window


@dataclass(frozen=True)
class ConsumeOutcome:
    """What one pool's run (or dry run) did on one Beijing day."""

    pool: str
    day: int
    status: str  # "planned" (dry run) | "done" | "claimed_elsewhere" | "skipped"
    plan: ConsumePlan | None = None
    consumed: int = 0
    calls: int = 0
    stop: str = ""  # why the run stopped, or why it did not run

    @property
    def final(self) -> bool:
        """Whether today's work for this pool is over (a skip is retried on a later tick)."""
        return self.status in ("done", "claimed_elsewhere")


@dataclass
class _Run:
    consumed: int = 0
    calls: int = 0
    errors: int = 0
    stop: str = ""


class ConsumeTask:
    """Plans and runs the consume task for the pools `targets()` names."""

    def __init__(self, cfg: Settings, gate: Gate,
                 targets: Callable[[], Mapping[str, ArkTarget]],
                 chat: ArkChat | None = None, background: bool = False,
                 alarm: SkewAlarm = SKEW) -> None:
        self.cfg = cfg
        self.alarm = alarm  # the store's clock decides the day it spends: not while distrusted
        self.gate = gate
        self.records = gate.records
        self.targets = targets
        self.chat = chat or ArkChat(cfg.consume_timeout_seconds)
        self.background = background
        self.owner = uuid.uuid4().hex
        self._handled: dict[str, int] = {}  # pool -> last Beijing day it needs no more work
        self._warned: dict[str, int] = {}
        self._worker: threading.Thread | None = None

    # -- reading --------------------------------------------------------------------------
    def _natural_days(self, history: Mapping[str, int], state: PoolState,
                      today: int) -> dict[int, int]:
        days = {int(k.split(":")[0]): v for k, v in history.items() if k.endswith(":natural")}
        first = history.get("first_day", today)  # before the first run, yesterday may predate the pool
        if today - 1 not in days and today - 1 >= first and state.get("day") == today:
            # Yesterday's total is still in the gate (prev_day_usage): take the task's part out.
            days[today - 1] = max(0, state.get("prev_day_usage") - history.get(f"{today - 1}:task", 0))
        return days

    def plan(self, pool: str) -> tuple[ConsumePlan | None, str, PoolState | None]:
        """Today's plan for `pool` from the store as it is now; writes nothing of the task's.

        Returns (plan, why-not, state); the plan is None when the pool cannot be planned.
        """
        state = self.gate.status(pool)
        d, now = state.decision, state.now_ms
        if d.reason == "no_snapshot":
            return None, "no snapshot yet", state
        if now > state.get("valid_until"):
            return None, "snapshot is stale (the billing sync is failing?)", state
        today = beijing_day(now)
        history = self.records.consume_history(pool)
        natural = self._natural_days(history, state, today)
        so_far = max(0, state.get("day_usage") - history.get(f"{today}:task", 0))
        fraction = (now - (next_beijing_midnight_ms(now) - MS_PER_DAY)) / MS_PER_DAY
        forecast = forecast_natural(natural, today, so_far, fraction)
        buffer = self.cfg.small_buffer
        at_today = beijing_time_ms(today, self.cfg.consume_at)
        next_run = at_today if now < at_today else at_today + MS_PER_DAY
        plan = plan_pool(
            pool=pool, now_ms=now, packages=state.packages,
            unsettled=d.used_balance - state.get("settled"), forecast=forecast,
            next_run_ms=next_run, daily_cap=d.daily_cap, small_buffer=buffer,
            collection_room=d.daily_cap - d.used_today - buffer,
            balance_room=d.balance_wall - d.used_balance - buffer,
            # The wall's expiry window: a snapshot's life and the longest call (limit.py).
            lead_ms=self.cfg.snapshot_max_age_minutes * 60_000 + RUN_MS + self.cfg.longest_call_ms())
        return plan, "", state

    # -- one pool -------------------------------------------------------------------------
    def run_pool(self, pool: str, target: ArkTarget | None, dry_run: bool = False) -> ConsumeOutcome:
        """Plan, and unless `dry_run`, claim today's run and consume the plan."""
        plan, why_not, state = self.plan(pool)
        now = state.now_ms if state else self.gate.now_ms()
        day = beijing_day(now)
        if self.alarm.reason is not None and not dry_run:
            # Spent on the store's day, which a wrong clock moves: a run at 00:05 on a clock
            # 10 minutes slow spent yesterday's room on Ark's today (red-team stop 37). Retried on
            # later ticks; `_run_due` says so once a day.
            return ConsumeOutcome(pool, day, "skipped", stop=f"clock: {self.alarm.reason}")
        if plan is None:
            return ConsumeOutcome(pool, day, "skipped", stop=why_not)
        if dry_run:
            log.info("%s %s dry-run plan=%s need=%s waste=%s forecast=%s/day reason=%s", TAG, pool,
                     f"{plan.tokens:,}", f"{plan.need:,}", f"{plan.waste:,}",
                     f"{plan.forecast.per_day:,}", plan.reason)
            return ConsumeOutcome(pool, day, "planned", plan)
        if target is None:
            return ConsumeOutcome(pool, day, "skipped", plan,
                                  stop="no deployment with an API key for this pool")
        mine = {"owner": self.owner, "status": "running", "started_ms": now}
        held = self.records.claim_day(pool, day, mine, CLAIM_MS)
        if held is not None:
            log.info("%s %s skip: today's run is already claimed (%s)", TAG, pool, held[:200])
            return ConsumeOutcome(pool, day, "claimed_elsewhere", stop="already claimed today")
        # Plan again now that the day is ours: another instance may have run a moment ago.
        plan, why_not, state = self.plan(pool)
        if plan is None or state is None:
            self._finish(pool, day, None, _Run(stop=why_not))
            return ConsumeOutcome(pool, day, "done", stop=why_not)
        self._remember_history(pool, state, day)
        log.info("%s %s plan=%s need=%s waste=%s forecast=%s/day reason=%s", TAG, pool,
                 f"{plan.tokens:,}", f"{plan.need:,}", f"{plan.waste:,}",
                 f"{plan.forecast.per_day:,}", plan.reason)
        run = _Run()
        try:
            self._execute(pool, target, plan, day, run)
        except (QuotaGuardError, OSError) as exc:  # e.g. the store went away mid-run (StoreUnavailable)
            run.stop = f"failed: {exc}"
            log.error("%s %s run failed after %s call(s): %s; not retried today", TAG, pool,
                      run.calls, exc)
        self._finish(pool, day, plan, run)
        return ConsumeOutcome(pool, day, "done", plan, run.consumed, run.calls, run.stop)

    def _remember_history(self, pool: str, state: PoolState, today: int) -> None:
        self.records.note_history(pool, "first_day", today)
        history = self.records.consume_history(pool)
        natural = self._natural_days(history, state, today)
        if today - 1 in natural and f"{today - 1}:natural" not in history:
            self.records.note_history(pool, f"{today - 1}:natural", natural[today - 1])
        self.records.forget_history(pool, [k for k in history if k[0].isdigit()
                                           and int(k.split(":")[0]) < today - HISTORY_KEEP_DAYS])

    def _finish(self, pool: str, day: int, plan: ConsumePlan | None, run: _Run) -> None:
        done = {"owner": self.owner, "status": "done", "planned": plan.tokens if plan else 0,
                "consumed": run.consumed, "calls": run.calls, "stop": run.stop,
                "finished_ms": self.gate.now_ms()}
        self.records.finish_claim(pool, day, done)
        log.info("%s %s done consumed=%s planned=%s calls=%s stop=%s", TAG, pool,
                 f"{run.consumed:,}", f"{plan.tokens if plan else 0:,}", run.calls, run.stop)

    def _execute(self, pool: str, target: ArkTarget, plan: ConsumePlan, day: int, run: _Run) -> None:
        """Call Ark until the plan is met or something says stop (`run.stop` says what)."""
        cfg = self.cfg
        while True:
            left = plan.tokens - run.consumed
            if left < cfg.consume_min_call_tokens:
                run.stop = "plan met"
                return
            if self.alarm.reason is not None:
                run.stop = f"clock: {self.alarm.reason}"
                return
            state = self.gate.status(pool)
            d, now = state.decision, state.now_ms
            if beijing_day(now) != day:
                run.stop = "the Beijing day ended"
                return
            if now > state.get("valid_until"):
                run.stop = "snapshot went stale"
                return
            room = d.headroom - cfg.small_buffer
            budget = min(left, room, cfg.consume_call_tokens)
            if budget < cfg.consume_min_call_tokens:
                run.stop = f"{d.binding_wall} wall near (headroom {d.headroom:,})"
                return
            output = min(cfg.consume_output_tokens, budget // 2)
            # Counted like the pool's proxied requests, in the same class (a DeepSeek count is
            # exact), and sized so that the gate, holding the prompt times that class's
            # correction, reserves no more than the budget.
            limits = replace(_CONSUME_LIMITS, method=counting.method_for(target.model, {}))
            exact = counting.counts_exactly(limits.method)
            k = d.exact_correction_ppm if exact else d.correction_ppm
            messages, _ = consume_messages(int((budget - output) * PPM / k), limits.method)
            # Sized by the rule the proxy's gate uses, from the body ArkChat sends.
            need = admission.size({"messages": messages, "max_completion_tokens": output},
                                  admission.ROUTES["acompletion"], limits)
            rid = f"consume:{self.owner[:12]}:{day}:{run.calls}"
            ttl = max(cfg.reservation_ttl_seconds, int(cfg.consume_timeout_seconds) + 60) * 1000
            granted = self.gate.reserve(pool, rid, need.wanted, ttl_ms=ttl, input_tokens=need.input_tokens,
                                        exact=exact, run_ms=cfg.call_run_ms(cfg.consume_timeout_seconds,
                                                                            need.output))
            if not granted.admitted:
                run.stop = f"the gate refused the call ({granted.reason})"
                return
            budget = granted.amount
            run.calls += 1
            try:
                reading = self.chat.chat(target, messages, need.per_choice)
            except ArkCallError as exc:
                run.errors += 1
                if exc.may_have_run:
                    # Unknown: the reservation counts as used (its prompt at the miscount ceiling).
                    counted = self.gate.settle(pool, rid, None, running=True).amount
                    run.consumed += counted
                    self.records.add_history(pool, f"{day}:task", counted)
                else:
                    self.gate.release(pool, rid)
                log.warning("%s %s call=%s failed (%s); %s", TAG, pool, run.calls, exc,
                            "counted as used" if exc.may_have_run else "nothing used")
                if run.errors >= cfg.consume_max_errors:
                    run.stop = f"{run.errors} failed calls in a row (last: {exc})"
                    return
                continue
            run.errors = 0
            measured = reading.prompt if reading.source == "measured" else None
            settled = self.gate.settle(pool, rid, reading.tokens, measured,  # k learns from it too
                                       reading.source == "estimated")
            used = settled.amount  # what the gate counted (no usage: more than the budget)
            run.consumed += used
            self.records.add_history(pool, f"{day}:task", used)
            log.info("%s %s call=%s budget=%s used=%s (%s) left=%s today=%s headroom=%s", TAG, pool,
                     run.calls, f"{budget:,}", f"{used:,}", reading.source,
                     f"{plan.tokens - run.consumed:,}", f"{settled.used_today:,}",
                     f"{settled.headroom:,}")
            if used > budget:
                run.stop = f"a call used {used:,} > its budget {budget:,}"
                log.warning("%s %s %s: stopping", TAG, pool, run.stop)
                return

    # -- the schedule ---------------------------------------------------------------------
    def tick(self) -> list[ConsumeOutcome]:
        """Run whatever is due now (the sync thread calls this on every poll)."""
        now = self.gate.now_ms()
        day = beijing_day(now)
        if now < beijing_time_ms(day, self.cfg.consume_at):
            return []
        try:
            targets = self.targets()
        except QuotaGuardError as exc:  # a bad deployment config: say so once a day, not per poll
            if self._warned.get("") != day:
                self._warned[""] = day
                log.error("%s cannot read the deployments: %s", TAG, exc)
            return []
        due = {p: t for p, t in targets.items() if self._handled.get(p) != day}
        if not due:
            return []
        if not self.background:
            return self._run_due(due, day)
        if self._worker is None or not self._worker.is_alive():
            # A run takes many calls: keep the sync thread free to sync meanwhile.
            self._worker = threading.Thread(target=self._run_due, args=(due, day),
                                            name="vqg-consume", daemon=True)
            self._worker.start()
        return []

    def _run_due(self, due: Mapping[str, ArkTarget], day: int) -> list[ConsumeOutcome]:
        outcomes = []
        for pool, target in sorted(due.items()):
            try:
                outcome = self.run_pool(pool, target)
            except (StoreUnavailable, QuotaGuardError, OSError) as exc:
                log.error("%s %s failed: %s; will retry on a later tick", TAG, pool, exc)
                continue
            except Exception:  # the sync thread must outlive a bad run
                log.exception("%s %s failed unexpectedly; will retry on a later tick", TAG, pool)
                continue
            outcomes.append(outcome)
            if outcome.final:
                self._handled[pool] = day
            elif self._warned.get(pool) != day:
                self._warned[pool] = day
                log.warning("%s %s not run yet: %s; retrying on later ticks", TAG, pool, outcome.stop)
        return outcomes


def outcome_json(outcome: ConsumeOutcome) -> dict[str, object]:
    """An outcome as plain JSON-able values (for the CLI)."""
    out = asdict(outcome)
    if outcome.plan is not None:
        out["plan"]["waste"] = outcome.plan.waste
    return out
