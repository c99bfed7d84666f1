"""The billing sync: list packages, compute each pool's limit, install the snapshot (docs/limit.md).

One `SyncService` per proxy process runs a daemon thread. A Redis lock per account elects one
process to call the billing API when a sync is due; every process reads the shared snapshot.
A sync is due when its adaptive interval has passed (normal, tighter when headroom is low,
right after a package expiry) or when usage since the last sync passed the burst threshold.
Time is the gate's — the Redis server's clock unless one is injected — so the lookups
`U(t − Δ)` read the timeline on the clock that stamped it, whatever this host's clock says.

History: the sync that creates a pool's state (its first, or the first after the store lost
it) keeps what may have run unseen off the balance wall, or with no unseen bound holds the pool
until the history covers Δ_assumed (limit.py), and logs which: `🕒 [COLD-START]`
when nobody knew the pool, `⛔ [STATE-LOST]` when this process (its checkpoint of each pool's
generation and today's usage, read at every poll) or the account's sync record knew an
earlier generation. A process that finds a generation changed under it reports the loss too
and raises today's usage to its checkpoint (the gate's `recover`, a max): every process
that saw the old day's count contributes it, and the new limit is in Redis for all of them.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from . import metrics
from .clock import MINUTE_MS, SKEW, SkewAlarm, to_beijing
from .config import Settings
from .errors import BillingAuthError, BillingError, GateError, QuotaGuardError, StoreUnavailable
from .gate import PPM, Decision, Gate, PoolState
from .limit import (
    QUIET_MS,
    UNSEEN_SETTLED_MS,
    YOUNG_MS,
    LimitResult,
    LimitState,
    PackageView,
    UsageView,
    assumed_lag_ms,
    compute_limit,
    next_expiry_ms,
)
from .volcengine.billing import BillingClient, ResourcePackage
from .volcengine.packages import PoolSpec, assign

log = logging.getLogger("volc_quota_guard.sync")

LOCK_MS = MINUTE_MS  # long enough for a paginated listing with retries
BURST_SPACING_MS = MINUTE_MS  # burst syncs at most once a minute per account
RETRY_MS = MINUTE_MS  # after a failed sync, try again this soon
HOLD_SLACK_MS = 1_000  # the sync after a hold runs this long after its end (Redis's clock moved on)
# How far back each sync reads the usage timeline at least: the lag observer searches it (a
# lower bound found in less of it stays a lower bound) and the anchor's margin looks back Δ.
TIMELINE_READ_MS = 8 * 60 * MINUTE_MS
# A process that stamped a poll this recently may still be admitting (its sync thread stuck, or
# none: a hook-only process): a generation that replaces a lost one stays held until each such
# process has polled it and said what it saw, or Δ_assumed ends. A process that stops cleanly
# takes its stamp with it; one that crashed keeps the next wipe held for Δ_assumed for a day.
PEER_MEMORY_MS = 24 * 60 * MINUTE_MS
STOPPED = "stopped:"  # a clean stop's stamp (a missing one may be a wipe's doing)
REPORT_POLLS = 3  # ... and at least this many polls (+2 s): a process that started after the
REPORT_SLACK_MS = 2_000  # last poll read its stamp, and whose stamp the wipe took, reports by then
BILLING_EVENT = {"vqg_billing": True}  # marks 💸 and ⛔ lines: a finding about the pool, not a sync failure


@dataclass(frozen=True)
class Checkpoint:
    """What this process last saw of a pool's state (read at every poll)."""

    generation: int  # the state's hist_at
    day: int  # Beijing day of `today`
    today: int  # today's usage + in-flight
    lags: tuple[tuple[int, int], ...] = ()  # the limit estimator's observed lags
    # Lifetime usage + in flight the balance API may not show yet (less the higher of the last
    # snapshot's settled estimate and the proven settled floor), and `unseen`: what a new
    # generation must assume ran unseen if the state goes now.
    unsettled: int = 0
    # What the last sync kept off the wall as possibly unseen and unsettled: a young generation's
    # bound, and after it whatever the balance still shows above the free total. A young history
    # ends by age unproven (under a 1,230-min lag the 107,717 that ran before the first start had
    # not settled at 8 h), and a wipe after that forgot it: billed 45,357 (fuzz seed 1602).
    unseen: int = 0
    floor: int | None = None  # the last sync's settled floor (limit.settled_floor)
    ucum: int = 0  # the most lifetime usage seen in this generation (it never goes down)
    carry_day: int = 0  # usage also counted on that Beijing day (calls Ark may bill after midnight)
    carry: int = 0
    inflight: int = 0  # in flight, prompts at the miscount ceiling (in `today` too)


def _reports(meta: dict[str, str], pool: str, gen: int) -> list[int]:
    """What the processes that found generation `gen` replacing one they knew saw unsettled
    (`lost:<pool>:<owner>`; `lost:<pool>` from a release before stop 42)."""
    found = []
    for key, value in meta.items():
        if key == f"lost:{pool}" or key.rpartition(":")[0] == f"lost:{pool}":
            at, _, bound = value.partition(":")
            if at == str(gen) and bound.isdigit():
                found.append(int(bound))
    return found


def _awaiting(meta: dict[str, str], pool: str, gen: int) -> bool:
    """Whether a process running when generation `gen` replaced a lost one has not polled it
    yet (its poll began after `gen` began); unknown (no record of who ran) counts as yes."""
    of, _, who = meta.get(f"await:{pool}", "").partition(":")
    if of != str(gen):
        return True
    polls = [meta.get(f"seen:{owner}", "") for owner in who.split(",") if owner]
    # A hook-only process (`-<ms>`) never reports: waited for until Δ_assumed ends.
    return any(not poll.isdigit() or int(poll) <= gen for poll in polls)


def _stamp(value: str) -> int | None:
    """When a `seen:` stamp's poll began (a hook-only process's is negative), or None."""
    digits = value[1:] if value.startswith("-") else value
    return int(digits) if digits.isdigit() else None


def _start_text(history_start: int, held_until: int, young: int) -> str:
    """How a new history protects the balance wall: a hold (no unseen bound), or the bound."""
    if held_until > history_start:
        return (f"; held until {to_beijing(held_until):%H:%M} (Beijing): the balance API may not "
                f"show the last {-(-(held_until - history_start) // MINUTE_MS)} min of usage yet")
    if young:
        return (f"; the balance wall keeps {young:,} tokens off until the API shows that much "
                f"settled (a ceiling for at most {YOUNG_MS // 3_600_000} h, the lowest estimate after; "
                f"no quiet stretch takes the balance as exact before {UNSEEN_SETTLED_MS // 3_600_000} h)")
    return ""


class PackageLister(Protocol):
    def list_resource_packages(self) -> list[ResourcePackage]: ...


@dataclass(frozen=True)
class SyncOutcome:
    account: str
    ran: bool  # False: not due, or another process holds the lock
    results: tuple[LimitResult, ...] = ()
    error: str | None = None


def _views(packages: Iterable[ResourcePackage]) -> list[PackageView]:
    # UsedUp packages stay in the view (at 0) so running one dry is not a package change.
    return [PackageView(p.instance_no, p.available if p.is_effective else 0, p.expires_ms, p.total)
            for p in packages if p.is_token_unit and p.status.lower() in ("effective", "usedup")]


class SyncService:
    """Syncs every guarded pool's snapshot from the billing API."""

    def __init__(
        self,
        cfg: Settings,
        gate: Gate,
        pools: Callable[[], list[PoolSpec]],
        lister_for: Callable[[str], PackageLister] | None = None,
        alarm: SkewAlarm = SKEW,
        billing: bool = True,
    ) -> None:
        self.cfg = cfg
        # False: a process whose billing sync is off (VQG_SYNC_ENABLED=false) only stamps that it
        # admits and never reports (`-<ms>`): a lost generation waits Δ_assumed for it.
        self.billing = billing
        self.alarm = alarm
        self.gate = gate
        self.records = gate.records
        self.pools = pools
        self._lister_for = lister_for or (lambda account: BillingClient.for_account(account, config=cfg))
        self._listers: dict[str, PackageLister] = {}
        self.owner = uuid.uuid4().hex
        self.after_tick: list[Callable[[], object]] = []  # e.g. the consume task's schedule
        self.checkpoints: dict[str, Checkpoint] = {}
        # Per account: the other processes seen polling (owner -> when its last poll began), kept
        # here too: a wipe takes the account's record with it.
        self.peers: dict[str, dict[str, int]] = {}
        self._awaits: dict[str, tuple[int, frozenset[str]]] = {}  # pool -> (generation, peers) to record
        self._reported: set[tuple[str, int]] = set()  # (pool, generation) whose start was logged
        self._warned: set[tuple[str, tuple[int, int]]] = set()  # (pool, other settings) said
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- time and election --------------------------------------------------------------------
    def now_ms(self) -> int:
        return self.gate.now_ms()

    def check_clock(self, host_s: Callable[[], float] | None = None) -> None:
        """Redis's clock decides every process's Beijing day and what expires when: one that
        disagrees with this host's counts traffic on the wrong day (a Redis clock 10 minutes fast
        burned 800,000 past the cap at midnight, red-team stop 37). Which of the two is wrong
        cannot be told from here, so the hook refuses while they disagree (`SkewAlarm`)."""
        reading = self.gate.clock_skew_ms(*(() if host_s is None else (host_s,)))
        if reading is None:
            return
        skew, slack = reading
        limit_ms = self.cfg.max_clock_skew_seconds * 1000
        if abs(skew) - slack <= limit_ms:
            if self.alarm.reason is not None:
                log.warning("✅ [CLOCK] the Redis server's clock agrees with this host's again "
                            "(%+.3f s): guarded requests are admitted", skew / 1000)
            self.alarm.reason = None
            return
        reason = (f"the Redis server's clock is {skew / 1000:+.1f} s off this host's (more than "
                  f"VQG_MAX_CLOCK_SKEW_SECONDS={self.cfg.max_clock_skew_seconds:g}): the Beijing "
                  "day and package expiries cannot be trusted; fix the clock (NTP)")
        if self.alarm.reason is None:
            log.critical("⛔ [CLOCK] %s; guarded requests are refused until they agree", reason)
        self.alarm.reason = reason

    def due(self, account: str, specs: list[PoolSpec], now: int) -> str | None:
        """Why a sync is due now ('interval', 'burst', 'first'), or None."""
        meta = self.records.sync_meta(account)
        if "next_at" not in meta:
            return "first"
        if now >= int(meta["next_at"]):
            return "interval"
        if int(meta.get("last_at", 0)) > now + MINUTE_MS:
            return "the clock went back (the last sync is in the future)"
        since = self.records.lifetime_usage(s.pool for s in specs) - int(meta.get("usage_total", 0))
        if since >= self.cfg.burst_tokens and now - int(meta.get("last_at", 0)) >= BURST_SPACING_MS:
            return f"burst (+{since:,} tokens since the last sync)"
        return None

    def maybe_sync(self, account: str, specs: list[PoolSpec]) -> SyncOutcome:
        """Sync the account if due and if this process wins the lock."""
        now = self.now_ms()
        if self.due(account, specs, now) is None:
            return SyncOutcome(account, False)
        if not self.records.take_sync_lock(account, self.owner, LOCK_MS):
            return SyncOutcome(account, False)
        try:
            why = self.due(account, specs, now)  # re-check: another process may just have synced
            if why is None:
                return SyncOutcome(account, False)
            return self.sync_account(account, specs, why)
        finally:
            self.records.drop_sync_lock(account, self.owner)

    # -- history: checkpoints and lost state ------------------------------------------------
    def _last_seen(self, pool: str) -> Checkpoint | None:
        """The last poll's checkpoint, raised to this process's latest gate answer of the same
        generation: what the hook admitted after the poll is not lost with the state (a wipe
        seconds after a burst burned 382,275 past the daily cap: fuzz seed 802)."""
        seen = self.checkpoints.get(pool)
        d = None if seen is None else self.gate.sighting(pool, seen.generation)
        if seen is None or d is None:
            return seen
        settled = d.settled if seen.floor is None else max(d.settled, seen.floor)
        unsettled = max(seen.unsettled, max(0, d.lifetime_worst - settled) + seen.unseen)
        seen = replace(seen, ucum=max(seen.ucum, d.ucum))
        if d.carry_day > seen.carry_day or (d.carry_day == seen.carry_day and d.carry > seen.carry):
            seen = replace(seen, carry_day=d.carry_day, carry=d.carry)
        seen = replace(seen, inflight=max(seen.inflight, d.lifetime_worst - d.ucum))
        if d.day > seen.day:  # the answer is of a later Beijing day: its count is today's
            return replace(seen, day=d.day, today=d.today_worst, unsettled=unsettled)
        today = max(seen.today, d.today_worst) if d.day == seen.day else seen.today
        return replace(seen, today=today, unsettled=unsettled)

    def checkpoint(self, pool: str, account: str | None = None) -> None:
        """Read the pool's generation and today's count; report a generation that changed."""
        before = self._last_seen(pool)  # taken before the read: its answers ran before it too
        h = self.gate.history(pool)
        if h is None:
            if account is not None and pool in self.checkpoints:
                # Gone under us with the account's record kept (evicted keys): the next sync
                # must not wait for its interval to recreate the pool (and report the loss).
                self.records.write_sync_meta(account, {"next_at": 0})
            return  # the sync that recreates it reports the loss
        gen = h["hist_at"] or 1
        if before is not None and before.generation == gen and h["ucum"] < before.ucum:
            # Lifetime usage went down in the same generation: the store came back from an older
            # copy of itself (an RDB dump, a replica promoted before it had every write). What
            # ran after that copy is in no count and the API will not show it for Δ: drop the
            # state so the next sync starts a lost generation (held, this process's unsettled
            # usage off the wall, today's count restored) and keep what we saw as its checkpoint.
            if self.gate.drop_rolled_back(pool, gen, before.ucum):
                log.error("⛔ [STATE-LOST] %s: the store went back in time (lifetime usage %s, this "
                          "process saw %s): treated as lost state", pool, f"{h['ucum']:,}",
                          f"{before.ucum:,}", extra=BILLING_EVENT)
            if account is not None:
                self.records.write_sync_meta(account, {"next_at": 0})
            self.checkpoints[pool] = before
            return
        seen = self._last_seen(pool)
        if seen is not None and seen.generation != gen:
            bound = max(self.cfg.unseen_day_tokens, seen.unsettled)
            if account is not None:
                # The process that recreated the pool knew nothing of ours: the next sync (this
                # tick's) holds the pool as lost and keeps what we saw unsettled off the wall.
                self.records.write_sync_meta(account, {f"lost:{pool}:{self.owner}": f"{gen}:{bound}",
                                                       "next_at": 0})
            self._state_lost(pool, gen, seen, "its counters, usage timeline and snapshot "
                             "(another process recreated them)", h,
                             f"; the next sync keeps {bound:,} tokens off the balance wall until the "
                             "API shows that much settled")
        # What the generation keeps off as unseen is in its shared state, whichever process
        # synced last: a process that only polls must carry it too (it may outlive the syncer).
        shared = LimitState.from_json(self.records.limit_state(pool))
        held = shared.unseen_held if shared.generation == gen else None
        if seen is not None and seen.generation == gen:
            self._remember(pool, gen, h, seen.lags, seen.unseen if held is None else held, seen.floor)
        else:
            self._remember(pool, gen, h, (), held or 0, None)

    def heartbeat(self, account: str, began: int) -> None:
        """Record that this process polled the account's pools from `began` on (after any loss
        it found was reported), and remember who else polls: a generation created after a loss
        is held until each of them has polled it."""
        meta = self.records.sync_meta(account)
        peers = self.peers.setdefault(account, {})
        gone = []
        for key, value in meta.items():
            owner = key.rpartition(":")[2]
            stopped = value.startswith(STOPPED)
            at = _stamp(value.removeprefix(STOPPED))
            if not key.startswith("seen:") or owner == self.owner or at is None:
                continue
            if stopped:  # it stopped cleanly: nothing of it to wait for
                peers.pop(owner, None)
            else:
                peers[owner] = max(peers.get(owner, 0), at)
            if began - at > PEER_MEMORY_MS:
                gone += [k for k in meta if k.startswith(("seen:", "lost:")) and k.endswith(f":{owner}")]
        for owner in [o for o, at in peers.items() if began - at > PEER_MEMORY_MS]:
            del peers[owner]
        self.records.write_sync_meta(account, {f"seen:{self.owner}": began if self.billing else -began})
        if gone:
            self.records.drop_sync_meta(account, gone)

    def report_window_ms(self) -> int:
        """How long a lost generation waits at least: every live process polls in this time."""
        return int(REPORT_POLLS * self.cfg.sync_poll_seconds * 1000) + REPORT_SLACK_MS

    def _live_peers(self, account: str, now: int, meta: dict[str, str]) -> frozenset[str]:
        """The other processes that polled the account within PEER_MEMORY_MS (remembered, or in
        a record that survived the pool's keys)."""
        seen = dict(self.peers.get(account, {}))
        for key, value in meta.items():
            at = _stamp(value)
            if key.startswith("seen:") and value.startswith(STOPPED):
                seen.pop(key[5:], None)
            elif key.startswith("seen:") and at is not None:
                seen[key[5:]] = max(seen.get(key[5:], 0), at)
        return frozenset(o for o, at in seen.items() if o != self.owner and now - at <= PEER_MEMORY_MS)

    def _remember(self, pool: str, gen: int, h: dict[str, int],
                  lags: tuple[tuple[int, int], ...], unseen: int, floor: int | None) -> None:
        # In flight as a settle without usage would count it (its prompts at the miscount
        # ceiling, corr_max for both classes: never less): a wipe loses the reservations.
        ceiling = h["corr_max"] or 3 * PPM
        unmeasured = sum(max(0, -(-h[est] * ceiling // PPM) - h[f"{est}_res"])
                         for est in ("inflight_est", "inflight_xest"))
        # The floor is proven whatever the lag: with a 20-min Δ_assumed and the API current, the
        # snapshot's estimate alone left 4,009,432 "unsettled" after a wipe (fuzz seed 240).
        settled = h["settled"] if floor is None else max(h["settled"], floor)
        own = max(0, h["ucum"] + h["inflight"] + unmeasured - settled)
        self.checkpoints[pool] = Checkpoint(gen, h["day"], h["day_usage"] + h["inflight"] + unmeasured, lags,
                                            own + unseen, unseen, floor, h["ucum"], h["carry_day"],
                                            h["carry"], h["inflight"] + unmeasured)

    def _state_lost(self, pool: str, gen: int, seen: Checkpoint | None, what: str,
                    h: dict[str, int] | None = None, start: str | None = None) -> None:
        """Log the loss once per generation; mark it in Redis and restore today's count."""
        s = seen or Checkpoint(0, 0, 0)  # nothing seen: nothing to restore
        decision = self.gate.recover(pool, gen, s.day, s.today, s.carry_day, s.carry, s.inflight)
        if (pool, gen) in self._reported or decision.reason != "recovered":
            return
        self._reported.add((pool, gen))
        held_until = self.records.state_int(pool, "hold_until")
        young = LimitState.from_json(self.records.limit_state(pool))
        today = (f"today's usage restored to {decision.used_today:,} from this process's checkpoint"
                 if seen else "today's usage before the loss is unknown")
        log.error("⛔ [STATE-LOST] %s: %s vanished while the guard was running; %s, and the daily "
                  "cap is lowered by %s until Beijing midnight%s", pool, what, today,
                  f"{self.cfg.unseen_day_tokens:,}",
                  start if start is not None else _start_text(
                      gen, held_until, young.unseen_off if young.unseen_ref is not None else 0),
                  extra=BILLING_EVENT)

    # -- one sync -----------------------------------------------------------------------------
    def _lister(self, account: str) -> PackageLister:
        if account not in self._listers:
            self._listers[account] = self._lister_for(account)
        return self._listers[account]

    def sync_account(self, account: str, specs: list[PoolSpec], why: str = "manual") -> SyncOutcome:
        """Call the billing API once and install a snapshot for each of the account's pools."""
        started = self.now_ms()
        try:
            packages = self._lister(account).list_resource_packages()
        except (BillingError, QuotaGuardError) as exc:
            kind = type(exc).__name__
            metrics.sync_failed(account, exc)
            loud = log.critical if isinstance(exc, BillingAuthError) else log.error
            loud("❌ [Sync] %s: billing API failed (%s: %s); snapshots stay until they go stale, "
                 "then these pools get no headroom: %s", account, kind, exc,
                 ", ".join(s.pool for s in specs))
            self.records.write_sync_meta(account, {"next_at": started + RETRY_MS,
                                                   "last_error": f"{kind}: {exc}", "last_error_at": started})
            return SyncOutcome(account, True, error=f"{kind}: {exc}")

        assignment = assign(packages, specs)
        results = []
        next_at = started + self.cfg.sync_interval_minutes * MINUTE_MS
        # Never let the snapshot go stale before the next sync replaces it (an interval longer
        # than VQG_SNAPSHOT_MAX_AGE_MINUTES refused every request in the gap).
        next_at = min(next_at, started + max(MINUTE_MS, (self.cfg.snapshot_max_age_minutes - 1) * MINUTE_MS))
        meta = self.records.sync_meta(account)
        gens: dict[str, str | int] = {}
        failed: list[str] = []
        superseded = False
        for spec in specs:
            pooled = assignment.pools[spec.pool]
            views = _views(pooled.packages)
            try:
                try:
                    result, decision = self._sync_pool(spec.pool, views, started, meta)
                except GateError as exc:
                    if exc.code != "generation":
                        raise
                    # The store lost the state (or another process replaced it) after this sync
                    # read it: computed for a generation that is gone, the snapshot was refused.
                    # Again from the top, the state this sync creates is lost state (held, recovered).
                    log.warning("⚠️ [Sync] %s: the pool's state changed during the sync (%s); syncing "
                                "it again", spec.pool, exc)
                    result, decision = self._sync_pool(spec.pool, views, started, meta)
            except GateError as exc:
                if exc.code == "older_listing":
                    # This listing stalled past the lock and another process synced since: its
                    # balance may be one that process already saw spent. Theirs stands, and so
                    # does their account record (its next sync, its errors).
                    log.warning("⚠️ [Sync] %s: a later billing listing's snapshot is installed; this "
                                "one (begun %d s ago) is dropped", spec.pool,
                                (self.now_ms() - started) // 1000)
                    superseded = True
                    continue
                # One pool's snapshot the gate refuses must not stop the account's other pools;
                # this one keeps its snapshot until it goes stale (then it gets no headroom).
                metrics.sync_failed(account, exc)
                log.error("❌ [Sync] %s: the gate refused the snapshot (%s); the other pools went on; "
                          "retrying in a minute", spec.pool, exc)
                failed.append(f"{spec.pool}: {exc.code}")
                next_at = min(next_at, started + RETRY_MS)
                continue
            results.append(result)
            if spec.pool in self._awaits:  # a lost generation: who it waits for
                gen, peers = self._awaits.pop(spec.pool)
                gens[f"await:{spec.pool}"] = f"{gen}:{','.join(sorted(peers))}"
            gens[f"gen:{spec.pool}"] = self.checkpoints[spec.pool].generation \
                if spec.pool in self.checkpoints else result.history_start_ms
            if result.held_until_ms:
                next_at = min(next_at, result.held_until_ms + HOLD_SLACK_MS)  # serve at its end
                if result.state.lost:  # ... or once every process may have reported
                    next_at = min(next_at, started + self.report_window_ms() + HOLD_SLACK_MS)
            if decision.headroom < self.cfg.low_headroom_tokens:
                next_at = min(next_at, started + self.cfg.sync_low_interval_minutes * MINUTE_MS)
            expiry = next_expiry_ms(views, started)
            if expiry is not None:
                next_at = min(next_at, expiry + MINUTE_MS)  # see the expiry as soon as the API shows it
        for miss in assignment.unmatched:
            log.debug("[Sync] %s: package %s not used (%s)", account, miss.package.instance_no, miss.reason)
        if superseded:
            return SyncOutcome(account, True, tuple(results))
        record: dict[Any, Any] = {
            "next_at": next_at, "last_at": started, "last_ok_at": started,
            "last_error": "; ".join(failed),
            "usage_total": self.records.lifetime_usage(s.pool for s in specs),
            "api_packages": len(packages), "why": why}
        self.records.write_sync_meta(account, record | gens)
        return SyncOutcome(account, True, tuple(results))

    def _sync_pool(self, pool: str, views: list[PackageView], now: int,
                   meta: dict[str, str] | None = None) -> tuple[LimitResult, Decision]:
        cfg = self.cfg
        state = LimitState.from_json(self.records.limit_state(pool))
        status = self.gate.status(pool)
        exists = status.decision.reason != "no_snapshot"
        # Where our history begins: the state's stamp, or now for the state this call creates.
        history_start = (status.get("hist_at") or 1) if exists else now
        seen = self._last_seen(pool)
        # A state this call creates is lost state when this process or the account's sync
        # record knew an earlier generation, else a first start.
        lost = not exists and (seen is not None or bool((meta or {}).get(f"gen:{pool}")))
        # Another process saw this generation replace one it knew (`checkpoint`): lost too, and
        # what it saw unsettled is unseen.
        reports = _reports(meta or {}, pool, history_start)
        other = bool(reports)
        awaiting = True
        self._awaits.pop(pool, None)  # only this sync's: one whose install failed must not linger
        if lost:
            # The processes that were running may have admitted what no checkpoint here holds:
            # held until each has polled this generation (and reported), Δ_assumed at most.
            self._awaits[pool] = (0, self._live_peers(pool.split("/", 1)[0], now, meta or {}))
        elif exists:
            awaiting = now < history_start + self.report_window_ms() or _awaiting(
                meta or {}, pool, history_start)
        if not state.lags and seen is not None and seen.lags:
            state = replace(state, lags=seen.lags)  # the estimator's state went: keep what we saw
        # Only the recent timeline matters: the quiet check, U(t − Δ) and the lag observer (whose
        # lower bound stays a lower bound when its search starts later).
        lag = assumed_lag_ms(state, now, cfg.lag_floor_minutes * MINUTE_MS)
        since = now - max(lag + QUIET_MS, TIMELINE_READ_MS)
        entries, floor = self.gate.timeline_entries(pool, since)
        usage = UsageView(tuple((m, used) for m, used, _ in entries), floor,
                          lifetime_usage=status.get("ucum"), inflight=status.get("inflight"),
                          since_ms=since // MINUTE_MS * MINUTE_MS,
                          unsure=tuple(unsure for _, _, unsure in entries),
                          lifetime_unsure=status.get("unsure"))
        result = compute_limit(
            now_ms=now, packages=views, usage=usage, state=state,
            lag_floor_ms=cfg.lag_floor_minutes * MINUTE_MS, small_buffer=cfg.small_buffer,
            daily_cap=cfg.daily_cap, max_age_ms=cfg.snapshot_max_age_minutes * MINUTE_MS,
            evict_below=cfg.evict_below, history_start_ms=history_start,
            cold_start_admit=cfg.cold_start_admit_tokens,
            # Lost under this process: its own usage the API had not shown yet (its last poll,
            # raised by its later gate answers: `_last_seen`) is unseen too.
            unseen_tokens=max(cfg.unseen_day_tokens, seen.unsettled if lost and seen else 0,
                              max(reports, default=0)),
            # A call admitted just before the snapshot goes stale runs (renewed) up to the keep
            # horizon: 40 calls of 90 minutes outlived a package expiring past a TTL's lookahead
            # and billed 680,500 (red-team, stop 37).
            lost=lost or other, awaiting=awaiting,
            running_ms=cfg.longest_call_ms())
        start, top = cfg.correction_ppm()  # the cheap class; an exact count has its own floor
        snapshot = replace(result.snapshot, packages=[asdict(v) for v in views],
                           correction_min_ppm=start, correction_max_ppm=top,
                           unseen_day_tokens=cfg.unseen_day_tokens,
                           generation=history_start if exists else 0, listed_at_ms=now)
        self._warn_other_settings(pool, status)
        decision = self.gate.install_snapshot(pool, snapshot)
        h = self.gate.history(pool)
        gen = (h or {}).get("hist_at") or history_start
        if pool in self._awaits:
            self._awaits[pool] = (gen, self._awaits[pool][1])
        if not self.records.write_limit_state(pool, replace(result.state, generation=gen).to_json(),
                                              listed_at_ms=now, now_ms=self.now_ms()):
            log.warning("⚠️ [Sync] %s: a later billing listing's estimates are stored; this sync's "
                        "are dropped", pool)
        if not exists and h is not None:
            self._history_began(pool, gen, seen if lost else None, meta or {}, result, h)
        if h is not None:
            self._remember(pool, gen, h, result.state.lags, result.state.unseen_held,
                           result.state.settled_floor)
        today_usage = status.get("day_usage")
        b0 = result.free_total - (usage.lifetime_usage - today_usage)
        observed = "-" if result.lag_observed_ms is None else f"{result.lag_observed_ms // MINUTE_MS}min"
        log.info("🔄 [Sync] %s: Bal=%s UsageAtSync=%s Δ=%smin (observed %s) B0≈%s Expiring=%s "
                 "Unseen=%s Limit=%s Used=%s Headroom=%s",
                 pool, f"{result.balance:,}", f"{result.settled_usage:,}",
                 result.lag_assumed_ms // MINUTE_MS, observed, f"{b0:,}", f"{result.expiring:,}",
                 f"{result.unseen:,}",
                 f"{decision.balance_wall:,}", f"{decision.used_balance:,}", f"{decision.headroom:,}")
        for note in result.notes:
            log.warning("⚠️ [Sync] %s: %s", pool, note)
        if result.billing:
            if result.billing_started:
                log.error("💸 [BILLING] %s: the free balance reached 0 by consumption (a package ran dry) "
                          "with %s tokens of lifetime usage recorded: what ran past the free quota is "
                          "billed. Pool closed until a new package arrives.", pool,
                          f"{usage.lifetime_usage:,}", extra=BILLING_EVENT)
            else:
                log.error("💸 [BILLING] %s: free balance still 0 (since %d min ago); pool stays closed",
                          pool, (now - result.state.billing_since_ms) // MINUTE_MS, extra=BILLING_EVENT)
        return result, decision

    def _warn_other_settings(self, pool: str, status: PoolState) -> None:
        """Processes sharing a store with other walls take turns: each sync installs its own
        (a red-team pass saw the cap flip between 1M and 2M unnoticed). Said once per pair."""
        theirs = (status.get("buffer"), status.get("cap"))
        ours = (self.cfg.small_buffer, self.cfg.daily_cap)
        if status.decision.reason == "no_snapshot" or theirs == ours or (pool, theirs) in self._warned:
            return
        self._warned.add((pool, theirs))
        log.warning("⚠️ [CONFIG] %s: another process installed SMALL_BUFFER=%s DAILY_CAP=%s, this one "
                    "uses %s and %s: the walls follow whichever synced last; give every proxy "
                    "sharing this Redis the same VQG_SMALL_BUFFER and VQG_DAILY_CAP", pool,
                    f"{theirs[0]:,}", f"{theirs[1]:,}", f"{ours[0]:,}", f"{ours[1]:,}")

    def _history_began(self, pool: str, gen: int, seen: Checkpoint | None, meta: dict[str, str],
                       result: LimitResult, h: dict[str, int]) -> None:
        """This sync created the pool's state: a first start, or state that was lost."""
        known = meta.get(f"gen:{pool}")
        if seen is not None or known:
            lost = ["the pool's counters, usage timeline and snapshot"]
            if not any(k == "last_at" or k.startswith("gen:") for k in meta):  # no sync wrote it
                lost.append("the account's sync record")
            peers = self._awaits.get(pool, (0, frozenset()))[1]
            start = None
            if result.held_until_ms:
                who = (f"the {len(peers)} other process(es) polling this account have polled it"
                       if peers else "any other process polling this account has polled it")
                start = (f"; held until {who} and said what they admitted (at least "
                         f"{self.report_window_ms() / 1000:g} s, "
                         f"{to_beijing(result.held_until_ms):%H:%M} (Beijing) at the latest); "
                         f"{result.state.unseen_off:,} tokens off the balance wall until the API "
                         "shows that much settled")
            self._state_lost(pool, gen, seen if seen is not None and seen.generation != gen else None,
                             ", and ".join(lost), h, start)
            return
        self._reported.add((pool, gen))
        young = result.state.unseen_off if result.state.unseen_ref is not None else 0
        log.warning("🕒 [COLD-START] %s: the guard's history of this pool begins now; %s tokens "
                    "assumed used unseen are off today's cap until Beijing midnight%s", pool,
                    f"{self.cfg.unseen_day_tokens:,}", _start_text(gen, result.held_until_ms, young))

    # -- the thread ---------------------------------------------------------------------------
    def tick(self) -> list[SyncOutcome]:
        """One pass over every account: sync those that are due (the thread calls this)."""
        by_account: dict[str, list[PoolSpec]] = defaultdict(list)
        try:
            specs = self.pools()
        except Exception:  # noqa: BLE001  the thread must outlive a config it cannot read
            log.exception("❌ [Sync] cannot read the guarded pools; will retry")
            specs = []
        for spec in specs:
            by_account[spec.account].append(spec)
        outcomes = []
        try:
            if self.billing:  # a stamp-only thread leaves the clock to the syncing processes
                self.check_clock()
        except StoreUnavailable as exc:
            log.error("❌ [Sync] store unreachable, clock not checked (%s); will retry", exc)
        if self.alarm.reason is not None:
            # A sync on a wrong clock stamps its times into the store (next sync, validity,
            # listing order): once the clock is fixed they would keep an old snapshot and
            # refuse newer listings (red-team, stop 37). Nothing is admitted meanwhile anyway.
            by_account.clear()
        for account, specs in sorted(by_account.items()):
            if not self.billing:
                try:
                    self.heartbeat(account, self.now_ms())
                except StoreUnavailable as exc:
                    log.error("❌ [Sync] %s: store unreachable (%s); will retry", account, exc)
                continue
            try:
                began = self.now_ms()  # before the reads: a poll stamped later saw what is there now
                for spec in specs:
                    self.checkpoint(spec.pool, account)
                self.heartbeat(account, began)
                outcomes.append(self.maybe_sync(account, specs))
            except StoreUnavailable as exc:  # every Redis failure arrives as this (gate/store.py)
                metrics.sync_failed(account, exc)
                log.error("❌ [Sync] %s: store unreachable (%s); will retry", account, exc)
            except Exception:  # the thread must outlive any one bad sync
                log.exception("❌ [Sync] %s: unexpected error; will retry", account)
        for extra in self.after_tick:
            try:
                extra()
            except Exception:  # noqa: BLE001  nor any bad extra
                log.exception("❌ [Sync] %r failed; will retry", extra)
        return outcomes

    def start(self, poll_seconds: float = 5.0) -> None:
        if self._thread and self._thread.is_alive():
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                self.tick()
                self._stop.wait(poll_seconds)

        self._thread = threading.Thread(target=loop, name="vqg-sync", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout)
        for account in list(self.peers):  # a clean stop: the next wipe need not wait for us
            try:
                self.records.write_sync_meta(account, {f"seen:{self.owner}": f"{STOPPED}{self.now_ms()}"})
            except StoreUnavailable:
                pass
