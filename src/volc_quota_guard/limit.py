"""The balance-wall limit of one pool, computed at each billing sync (docs/limit.md).

Pure: no I/O. The sync feeds it the API's view of the pool's packages, our usage timeline and
the estimator state kept from earlier syncs; it returns the snapshot to install and the new state.

In lifetime-cumulative coordinates, the pool's free total `F = Bal + U_settled` is constant
between two syncs with the same package set (usage moves tokens from Bal to U). The API's
balance lags our usage by Δ, so `U_settled = U(t − Δ)`. Estimates of F, all ≤ the true one:

- lag-compensated: `Bal + U(t − Δ_assumed)` with Δ_assumed ≥ the worst observed lag and the floor;
- the lowest of those since the package set last changed (a quiet stretch makes it exact);
- an exact anchor `Bal + U(now)`, taken when our usage has not moved for longer than any lag
  (and, once usage nobody measured ran in this history, the settled floor proves all of it
  settled); while it holds it is used as is. Usage outside the proxy (the balance falls by more than we
  recorded) voids it; smaller outside usage is what SMALL_BUFFER is for.

With an anchor, each later sync locates the API's settled-through point on our timeline: it lies
before the end of the first minute (after the anchor) whose usage exceeds `F_anchor − Bal`, so
`now − that minute's end` is a lower bound of the lag — an observed Δ.

History start: the guard's timeline begins when the pool's state was created (a first start,
or a new generation after the store lost its data). Whatever ran on the account in the Δ before
that is unsettled and invisible to us, so an empty or short history is *unknown*, not quiet:
until the history covers Δ_assumed no estimate is kept as a bound; from then on
`Bal + U(t − Δ_assumed)` holds again, because the API has settled everything before the history
began. The exact anchor needs the history to cover the quiet stretch (and Δ_assumed) too. With
no unseen bound (below) the pool is held until then (lifetime usage of the new generation may not
pass `VQG_COLD_START_ADMIT_TOKENS`, default 0); with one, the young ceiling bounds the free total
from the first sync and no hold is needed.

Young history: waiting out Δ_assumed covers what ran unseen only if the true lag is ≤ Δ_assumed,
which a first start cannot know. A new generation records its first balance and `A`, the most that may
have run unseen and not settled by then (VQG_UNSEEN_DAY_TOKENS, or more for state lost under this
process); F ≥ that balance − A whatever the lag, so the free total is capped there. Once the API
has settled more than A since, some of it is ours and everything older is settled (time order),
which also bounds the lag from above; without that proof (a pool too small to show it) young
ends after YOUNG_MS. No quiet stretch anchors while young, and the cap stays the lowest
estimate's ceiling after, until an exact anchor.

Billing: the API's balance lags consumption, so it is never below the true one. A balance of 0
reached by a package running dry (it had tokens at the last sync and shows 0 now, still listed:
consumed, not expired) means the free quota is spent and whatever ran since was billed. The
pool is closed at once, the estimates start afresh from the next package, and the lag observer
takes nothing from it (at 0 the API's usage cannot move, which would read as a lag growing
without end).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .clock import MINUTE_MS
from .gate.values import Snapshot

QUIET_MS = 120 * MINUTE_MS  # no usage for this long: every plausible lag has settled
LAG_MEMORY_MS = 7 * 86_400_000  # observed lags are remembered a week
LAG_MARGIN = 1.25  # Δ_assumed = worst observed × margin + 2 min
LAG_PAD_MS = 2 * MINUTE_MS
LAG_BELIEVABLE_MS = 4 * 60 * MINUTE_MS  # a longer "lag" is a broken anchor, not a lag
# A young history's unseen allowance ends after this even without proof (a pool too small to
# show it settled); its ceiling stays under the lowest estimate, so the end opens no anchor alone.
YOUNG_MS = 8 * 60 * MINUTE_MS
YOUNG_TIGHT_MS = 60 * MINUTE_MS  # a young end's lag bound looser than this waits for a tighter one
# What ran before a history is taken as settled this long after it began, for a quiet anchor,
# unless the packages proved it sooner (the settled floor reached 0): the longest lag a scenario
# can draw (a day) and an hour. A quiet anchor after a young end by YOUNG_MS took a balance that
# did not show 176,591 unseen tokens yet under a 702-min lag as exact and billed 27,921 (fuzz
# seed 1119).
UNSEEN_SETTLED_MS = 25 * 60 * MINUTE_MS
LADDER_STEPS = 64  # expiry ladder steps in a snapshot (the gate takes at most 4096 bytes of it)


@dataclass(frozen=True)
class PackageView:
    """One free token package (Effective or UsedUp) as the balance API shows it now."""

    instance_no: str
    available: int
    expires_ms: int | None
    total: int = 0  # the package's size (TotalAmount); 0 = unknown, use `available`

    @property
    def size(self) -> int:
        return self.total or self.available


@dataclass(frozen=True)
class LimitState:
    """What the estimator carries from one sync to the next (stored as JSON per pool)."""

    packages: tuple[tuple[str, int], ...] = ()  # (instance no, last available) at the last sync
    gone: tuple[str, ...] = ()  # packages that left the list (expired), newest last
    lowest_free_total: int | None = None
    anchor_free_total: int | None = None
    anchor_ms: int = 0
    anchor_unsure: int = 0  # of the usage at the anchor, what was counted without a measurement
    # What the anchor may hold that the API had not settled when it was taken: our usage in the
    # Δ_assumed before the quiet began (see `_anchor_margin`); kept off the free total.
    anchor_margin: int = 0
    anchor_usage: int = 0  # our lifetime usage when the anchor was taken
    # The lowest `balance + our usage + in flight` any sync saw: F can only be lower, so
    # the API cannot have settled more than it less the balance. Only the lag observer reads it.
    upper_free_total: int | None = None
    lags: tuple[tuple[int, int], ...] = ()  # (observed at ms, lag ms)
    last_sync_ms: int = 0
    billing_since_ms: int = 0  # when a sync first found the free quota spent (0 = not billing)
    generation: int = 0  # the pool state's hist_at these estimates belong to (0 = unknown)
    # The balance at this generation's first sync (moved with package changes like F): the API
    # has settled at most this less the balance since the history began. None = not young.
    unseen_ref: int | None = None
    unseen_bound: int = 0  # ... and the most that may have run unseen then, not yet settled
    # The balance at the first sync, not moved by arrivals: what ran unseen before can have taken
    # no more than that (a free balance stops at 0, the rest is billed; later packages were not
    # there). None: unknown (a state from before stop 42).
    unseen_room: int | None = None
    # The generation replaced one a running guard lost (a wipe): held for Δ_assumed whatever the
    # bound, since what was admitted after the last checkpoint is in no bound (billed 134,300).
    lost: bool = False
    # Our recorded lifetime usage at the API's settled-through point is at least this (negative:
    # what ran before the history may be unsettled still); None = unknown. See `settled_floor`.
    settled_floor: int | None = None
    # The packages once lost more than A plus all we recorded: more ran unseen before the history
    # than A, or outside the proxy, and the floor's loss may be theirs (no floor hedge after).
    floor_overrun: bool = False
    # F is at least this whatever the lag: a first start's first balance less A (what ran unseen
    # took at most A, VQG_UNSEEN_DAY_TOKENS), moved with package changes like F, kept after the
    # history is no longer young. None: no such bound (no A, a lost history, or the premise
    # proven false: the packages lost more than A plus all we recorded, usage outside the proxy).
    least_free_total: int | None = None
    # What the last snapshot kept off the wall as possibly unseen (the balance above the free
    # total): the young bound, and after a young history ends by age what it never proved
    # settled. Status shows it; a lost generation's bound carries it.
    unseen_kept: int = 0

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @property
    def unseen_off(self) -> int:
        """What the young ceiling keeps off the first balance: the unseen bound, up to the room
        there was (a first start on an empty pool keeps nothing off the packages that arrive)."""
        return self.unseen_bound if self.unseen_room is None else min(self.unseen_bound, self.unseen_room)

    @property
    def unseen_held(self) -> int:
        """What a new generation must assume ran unseen and unsettled before this one began, if
        this state went now: the young bound, else what the last snapshot kept off as such."""
        return max(self.unseen_bound if self.unseen_ref is not None else 0, self.unseen_kept)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> LimitState:
        if not raw:
            return cls()

        def optional_int(v: Any) -> int | None:
            return None if v is None else int(v)

        return cls(
            packages=tuple((str(i), int(a)) for i, a in raw.get("packages") or ()),
            gone=tuple(str(i) for i in raw.get("gone") or ()),
            lowest_free_total=optional_int(raw.get("lowest_free_total")),
            anchor_free_total=optional_int(raw.get("anchor_free_total")),
            anchor_ms=int(raw.get("anchor_ms") or 0),
            anchor_unsure=int(raw.get("anchor_unsure") or 0),
            anchor_margin=int(raw.get("anchor_margin") or 0),
            anchor_usage=int(raw.get("anchor_usage") or 0),
            upper_free_total=optional_int(raw.get("upper_free_total")),
            lags=tuple((int(at), int(lag)) for at, lag in raw.get("lags") or ()),
            last_sync_ms=int(raw.get("last_sync_ms") or 0),
            billing_since_ms=int(raw.get("billing_since_ms") or 0),
            generation=int(raw.get("generation") or 0),
            unseen_ref=optional_int(raw.get("unseen_ref")),
            unseen_bound=int(raw.get("unseen_bound") or 0),
            unseen_room=optional_int(raw.get("unseen_room")),
            lost=bool(raw.get("lost")),
            settled_floor=optional_int(raw.get("settled_floor")),
            floor_overrun=bool(raw.get("floor_overrun", False)),
            least_free_total=optional_int(raw.get("least_free_total")),
            unseen_kept=int(raw.get("unseen_kept") or 0),
        )


@dataclass(frozen=True)
class UsageView:
    """Our side at sync time: the per-minute lifetime-usage timeline and what is in flight."""

    minutes: tuple[tuple[int, int], ...]  # (minute index, lifetime usage at its end), ascending
    floor: int  # usage recorded before the first minute in `minutes`
    lifetime_usage: int
    inflight: int
    since_ms: int = 0  # where the read began: before it, `floor` is not a lower bound
    # Lifetime usage counted without a measurement at each of `minutes` (aligned); what
    # surely ran (usage less unsure) is what the lag observer compares with the API.
    unsure: tuple[int, ...] = ()
    # Of `lifetime_usage`, what was counted without a measurement (None: the last entry's): the
    # read may begin after the last unmeasured minute, which does not make that usage measured.
    lifetime_unsure: int | None = None

    @property
    def unsure_now(self) -> int:
        if self.lifetime_unsure is not None:
            return self.lifetime_unsure
        return self.unsure[-1] if self.unsure else 0

    def usage_before(self, ms: int) -> int | None:
        """`usage_at(ms)`, or None where the read does not reach back to `ms`."""
        return self.usage_at(ms) if ms >= self.since_ms else None

    def usage_at(self, ms: int) -> int:
        """Usage recorded up to the last complete minute before `ms` (never more than at `ms`)."""
        i = bisect.bisect_right(self.minutes, (ms // MINUTE_MS - 1, float("inf")))
        return self.minutes[i - 1][1] if i else self.floor

    def last_change_ms(self) -> int | None:
        """End (ms) of the last minute our usage grew in; None where the read shows none."""
        before = self.floor
        last = None
        for minute, used in self.minutes:
            if used > before:
                last = (minute + 1) * MINUTE_MS
            before = used
        return last

    def first_reaching(self, tokens: int) -> int | None:
        """Start (ms) of the first minute whose recorded usage (a reservation kept whole counted
        in full: never later than the truth) reaches `tokens`; None before the read."""
        for minute, used in self.minutes:
            if used >= tokens:
                return minute * MINUTE_MS
        return None

    def first_above(self, tokens: int, since_ms: int) -> int | None:
        """End (ms) of the first minute from `since_ms` whose surely-run usage (measured, not a
        reservation kept whole) exceeds `tokens`: the API cannot have settled it yet."""
        for i, (minute, used) in enumerate(self.minutes):
            sure = used - (self.unsure[i] if i < len(self.unsure) else 0)
            if minute >= since_ms // MINUTE_MS and sure > tokens:
                return (minute + 1) * MINUTE_MS
        return None


@dataclass(frozen=True)
class LimitResult:
    snapshot: Snapshot
    state: LimitState
    balance: int
    settled_usage: int
    free_total: int
    lag_assumed_ms: int
    lag_observed_ms: int | None
    expiring: int
    external_usage: bool = False  # the API settled more than we ever recorded
    notes: list[str] = field(default_factory=list)
    billing: bool = False  # the free quota is spent: consumption since it ran out was billed
    billing_started: bool = False  # ... and this sync is the first to see it
    held_until_ms: int = 0  # > 0: the history is shorter than Δ_assumed; held until then
    history_start_ms: int = 1
    unseen: int = 0  # kept off the wall: what may have run unseen before a young history began


def assumed_lag_ms(state: LimitState, now_ms: int, floor_ms: int) -> int:
    recent = [lag for at, lag in state.lags if now_ms - at <= LAG_MEMORY_MS]
    if not recent:
        return floor_ms
    return max(floor_ms, int(max(recent) * LAG_MARGIN) + LAG_PAD_MS)


def compute_limit(
    *,
    now_ms: int,
    packages: Sequence[PackageView],
    usage: UsageView,
    state: LimitState,
    lag_floor_ms: int,
    small_buffer: int,
    daily_cap: int,
    max_age_ms: int,
    evict_below: int,
    history_start_ms: int = 1,
    cold_start_admit: int = 0,
    unseen_tokens: int = 0,
    lost: bool = False,
    awaiting: bool = True,
    running_ms: int = 0,
) -> LimitResult:
    """The pool's snapshot. `history_start_ms` is where our usage timeline begins (the state's
    hist_at; 1 = long ago); a new history is young: it keeps `unseen_tokens` (what may have run
    unseen, not settled, before it began) off the free total. Until the history covers
    Δ_assumed the snapshot holds the pool (lifetime usage reaches at most `cold_start_admit`)
    where no unseen bound applies, or where the history replaces a `lost` one while `awaiting`
    processes that were running then have not said what they saw."""
    balance = sum(p.available for p in packages)
    notes: list[str] = []
    if state.generation != history_start_ms and (state.generation, history_start_ms) != (0, 1):
        # Estimates of another generation are in another generation's lifetime coordinates;
        # what was learned about the API's lag still holds.
        state = LimitState(lags=state.lags, generation=history_start_ms, unseen_ref=balance,
                           unseen_bound=unseen_tokens, unseen_room=max(0, balance), lost=lost)
        if not lost and unseen_tokens > 0:
            state = replace(state, least_free_total=balance - state.unseen_off)
    elif lost:
        # Found lost later, or another process's report since: what it saw unsettled joins the
        # bound. (Only the first report used to: with the Δ_assumed hold gone, the creator's own
        # 72,360 stood where the other worker reported 84,420, and the pool billed 2,049.)
        raised = replace(state, unseen_bound=max(state.unseen_bound, unseen_tokens)) \
            if state.unseen_ref is not None else state
        # The settled floor began at minus the bound then: what a report adds may have settled
        # before any of ours too.
        more = raised.unseen_off - state.unseen_off
        state = replace(raised, lost=True, least_free_total=None,
                        settled_floor=None if raised.settled_floor is None else raised.settled_floor - more)
    before = dict(state.packages)
    previous = (before, state.gone, state.last_sync_ms)
    ran_dry = any(before.get(p.instance_no, 0) > 0 and p.available == 0 for p in packages)
    state = _follow_package_changes(state, packages, notes)
    if balance == 0 and (ran_dry or state.billing_since_ms):
        return _spent(now_ms, packages, usage, state, small_buffer, daily_cap, max_age_ms,
                      evict_below, notes)
    if state.billing_since_ms:
        notes.append("free quota is back: the estimates start afresh")
        state = replace(state, billing_since_ms=0, lowest_free_total=None, anchor_free_total=None,
                        least_free_total=None, upper_free_total=None)

    history_ms = now_ms - history_start_ms
    state = _young_ends(state, balance, usage, now_ms, history_start_ms, lag_floor_ms, notes)
    # Quiet for longer than any lag we know of: the API has settled all our usage. A quiet
    # stretch shorter than Δ_assumed proves nothing (a 150-min lag under a 2-hour quiet billed),
    # and neither does one in a young history (what ran unseen may be settling still).
    # The lag observer cannot see usage nobody measured (and what of it the API settles can hide
    # measured usage the API has not): once some ran in this history, a longer lag may have gone
    # unseen (a 360-min lag incident after unreported usage, quiet for two hours, anchored 590,000
    # tokens high), so the API must be proven to have settled all of ours by what the balance
    # lost. No quiet stretch is long enough to prove it (a 540-min lag billed 202,908, stop 38).
    floor = settled_floor(state, *previous, packages, usage)
    chain = _floor_chain(state, *previous, packages)
    if chain is not None and chain > usage.lifetime_usage:
        state = replace(state, floor_overrun=True, least_free_total=None)
    unsure_now = usage.unsure_now
    seen = unsure_now == 0
    proven = floor is not None and floor >= usage.lifetime_usage
    # This sync's own lag reading (below) counts before the quiet test: a lag that grew since the
    # last sync (an incident starting as the traffic stops) must not let a quiet stretch shorter
    # than it anchor (a red-team scenario anchored 140,000 high and billed 89,000, stop 35).
    probe = state
    if state.anchor_free_total is None and state.upper_free_total is not None:
        bound = min(state.upper_free_total, balance + usage.lifetime_usage + usage.inflight)
        reading = _lag_behind(usage, bound - balance, history_start_ms, now_ms)
        if reading is not None:
            probe = replace(state, lags=(*state.lags, (now_ms, reading))[-50:])
    quiet_ms = max(QUIET_MS, assumed_lag_ms(probe, now_ms, lag_floor_ms))
    unseen_settled = history_ms >= UNSEEN_SETTLED_MS or (floor is not None and floor >= 0)
    quiet = (usage.inflight == 0 and history_ms >= quiet_ms and state.unseen_ref is None
             and unseen_settled and usage.usage_at(now_ms - quiet_ms) == usage.lifetime_usage
             and (seen or proven))
    # In the anchor's own quiet stretch (no usage of ours since), what the API had not settled of
    # ours is still at most the anchor's margin, which was read while the timeline still showed
    # the minutes before the stop: a new anchor keeps no more off than that.
    kept = (state.anchor_margin if state.anchor_free_total is not None
            and state.anchor_usage == usage.lifetime_usage else None)
    if quiet:
        blind = None if state.upper_free_total is None or floor is None \
            else state.upper_free_total - balance - floor
        margin = _anchor_margin(usage, assumed_lag_ms(probe, now_ms, lag_floor_ms), floor, blind)
        margin = margin if kept is None else min(margin, kept)
        state = replace(state, anchor_free_total=balance + usage.lifetime_usage, anchor_ms=now_ms,
                        anchor_unsure=unsure_now, anchor_margin=margin,
                        anchor_usage=usage.lifetime_usage)
    # Where no quiet stretch gave an exact anchor, the lowest upper bound of F still places a
    # lower bound of the lag (a long lag must be seen before a lost state trusts Δ_assumed).
    upper = balance + usage.lifetime_usage + usage.inflight
    if state.upper_free_total is None or upper < state.upper_free_total:
        state = replace(state, upper_free_total=upper)

    observed: int | None = None
    external = False
    if state.anchor_free_total is not None and not quiet:
        settled = state.anchor_free_total - balance  # exact while the anchor holds
        if settled > usage.lifetime_usage:
            external = True  # the API settled more than we recorded: usage outside the proxy
            notes.append("balance fell by more than our recorded usage: usage outside the proxy?")
        else:
            # What ran since the anchor, measured, beyond what the API settled since: unsettled
            # (usage counted whole before the anchor must not hide it: compare increments).
            observed = _lag_behind(usage, settled - state.anchor_unsure, state.anchor_ms, now_ms)
            if observed is not None and observed > LAG_BELIEVABLE_MS:
                # Hours behind an anchor more likely means the anchor is low (an expiry shift
                # over-subtracted) than that the API is: keep it as a bound of F, not as exact,
                # and let the upper bound below observe the lag.
                notes.append(f"the API looks {observed // 60_000} min behind the anchor; "
                             "anchor dropped — check the account's usage outside the proxy")
                lowest = state.anchor_free_total if state.lowest_free_total is None \
                    else min(state.lowest_free_total, state.anchor_free_total)
                state = replace(state, anchor_free_total=None, lowest_free_total=lowest)
                observed = None
    if state.anchor_free_total is None and state.upper_free_total is not None and not quiet:
        # F is at most the bound, so the API settled at least the bound less the balance: the
        # lag found is a lower bound of the true one however long it is. A lag of hours (an
        # incident at Volcengine) is planned around, never disbelieved: that would bill.
        # The search starts where the history does, not where this bound was taken: a later,
        # lower bound must not forget that our earliest usage is still unsettled.
        observed = _lag_behind(usage, state.upper_free_total - balance, history_start_ms, now_ms)
    if observed is not None:
        state = replace(state, lags=(*state.lags, (now_ms, observed))[-50:])

    lag = assumed_lag_ms(state, now_ms, lag_floor_ms)
    estimate = balance + usage.usage_at(now_ms - lag)
    lowest = estimate if state.lowest_free_total is None else min(state.lowest_free_total, estimate)
    if history_ms < lag:
        # Usage from before our history may still be unsettled: this estimate is not a bound
        # (nor is the anchor, which needs a covered quiet stretch). Keep it out of the state.
        state = replace(state, last_sync_ms=now_ms)
    else:
        state = replace(state, lowest_free_total=lowest, last_sync_ms=now_ms)
    # A first start under an unseen bound is not held: the young ceiling below bounds the free
    # total whatever ran before (a hold on top refused 2.9% of the fuzz's served tokens). A lost
    # history is, while a process that was running may have admitted what no bound holds (its
    # view arrives at its next poll: a burst in no bound billed 134,300 under a 14-min lag,
    # `wipe-after-an-unchecked-burst`); once every one has reported, the bound holds all they
    # saw and the hold only refused (7.1% of the fuzz's served tokens, stop 42).
    held_until = (history_start_ms + lag if history_ms < lag
                  and (state.unseen_bound <= 0 or (state.lost and awaiting)) else 0)
    if external and state.anchor_free_total is not None:
        # Someone else drew on the pool: the anchor no longer holds; fall back to the estimates.
        lowest = min(lowest, state.anchor_free_total)
        state = replace(state, anchor_free_total=None, lowest_free_total=lowest)
    # The anchor is exact (nothing was unsettled when it was taken); the lag-compensated
    # estimates undershoot by the traffic between Δ_assumed and the true lag.
    free_total = lowest if state.anchor_free_total is None else state.anchor_free_total
    if state.anchor_free_total is not None and state.anchor_margin:
        # What the API has settled is at least the floor, so the anchor is high by at most what
        # it says was settled beyond that: the margin shrinks as the floor proves the rest.
        proof = None if floor is None else max(0, state.anchor_free_total - balance - floor)
        margin = state.anchor_margin if proof is None else min(state.anchor_margin, proof)
        state = replace(state, anchor_margin=margin)
        free_total -= margin
    if floor is not None and not (external or state.floor_overrun) and history_ms >= lag:
        # This sync's estimate holds unless the lag grew past Δ_assumed; `Bal + floor` holds
        # whatever the lag, unless more than A ran unseen before the history or usage outside
        # the proxy settled (the packages' loss is taken as ours): a second A stays off it, so
        # up to 2A unseen (or A outside) leaves it a bound (red-team: 350,000 unseen with
        # A = 200,000, then a 180-min lag incident, billed 90,000 without it). Their least is a
        # bound while either holds, and it frees what the lowest estimate locks away when it
        # was taken mid-burst: the API settled a 4.3M burst 44 min behind while Δ_assumed was
        # 56, and that estimate kept 4.1M off for two days (fuzz seed 6 stranded 8.2M).
        free_total = max(free_total, min(estimate, balance + floor - state.unseen_bound))
    if state.unseen_ref is not None:
        # Young: F = the first balance less what was unseen and unsettled then, whatever the lag.
        free_total = min(free_total, state.unseen_ref - state.unseen_off)
    if external:
        state = replace(state, least_free_total=None)
    elif state.least_free_total is not None:
        # ... and so it stays, once young: an estimate taken mid-burst undershoots F by the
        # traffic between the true lag and Δ_assumed, the floor hedge by a second A.
        free_total = max(free_total, state.least_free_total)
    # A free total below the balance: the balance still shows what may have run unseen, keep it
    # off. Not only while young: the young ceiling stays the lowest estimate after, and clamping
    # it at the balance there let a 777-min lag bill 18,202 (fuzz seed 729).
    unseen = max(0, balance - free_total)
    settled_usage = max(0, free_total - balance)

    valid_until = now_ms + max_age_ms
    # Expiry: what the API still shows in packages that expire before the snapshot does is
    # taken off now. FIFO means our own use eats those first, so this only ever errs safe. A
    # request admitted just before the snapshot goes stale still runs for `running_ms` (as long
    # as the proxy keeps and renews a call: VQG_MAX_CALL_SECONDS and a TTL): a package expiring
    # in that time is off too (16 requests admitted a minute before such an expiry ran on past
    # it and billed 184,000, red-team stop 35; 90-minute calls outlived a TTL's lookahead and
    # billed 680,500, stop 37).
    expiring = sum(p.available for p in packages
                   if p.expires_ms is not None and p.expires_ms <= valid_until + running_ms)
    # Later expiries go on the ladder: a call Ark may run past one is admitted without it
    # (sixteen 60,000-token calls Ark ran 190 minutes, past the longest call, billed 676,000).
    ladder = expiry_ladder(packages, valid_until + running_ms)
    step, counted_from = day_step(now_ms, packages, usage, *previous, lag_ms=lag,
                                  floor_before=state.settled_floor, floor=floor)
    state = replace(state, settled_floor=floor, unseen_kept=unseen)
    snapshot = Snapshot(balance=balance, settled_usage=settled_usage, expiring=expiring + unseen,
                        small_buffer=small_buffer, daily_cap=daily_cap,
                        valid_until_ms=valid_until, evict_below=evict_below,
                        hold_until_ms=held_until, hold_cap=cold_start_admit if held_until else 0,
                        day_step=step, day_since_ms=previous[2], day_from=counted_from,
                        ladder=ladder)
    return LimitResult(snapshot, state, balance, settled_usage, free_total, lag, observed,
                       expiring, external, notes, held_until_ms=held_until,
                       history_start_ms=history_start_ms, unseen=unseen)


def expiry_ladder(packages: Sequence[PackageView], after_ms: int) -> tuple[tuple[int, int], ...]:
    """(expires at, free tokens) of the packages expiring after `after_ms`, soonest first, at
    most LADDER_STEPS: any further are merged into the last step (off a call that reaches it
    too: merging can only take more off)."""
    steps = sorted((p.expires_ms, p.available) for p in packages
                   if p.expires_ms is not None and p.expires_ms > after_ms and p.available > 0)
    if len(steps) > LADDER_STEPS:
        steps[LADDER_STEPS - 1:] = [(steps[LADDER_STEPS - 1][0], sum(a for _, a in steps[LADDER_STEPS - 1:]))]
    return tuple(steps)


def _young_ends(state: LimitState, balance: int, usage: UsageView, now_ms: int,
                history_start_ms: int, lag_floor_ms: int, notes: list[str]) -> LimitState:
    """A young history ends once the API settled more than the unseen bound since it began (time
    order: some of it is ours, so all before is settled) or after YOUNG_MS; from then on quiet
    stretches anchor again. Its bound stays the lowest estimate's ceiling: the estimates it saw
    may hold unseen usage the API had not shown, and the lags read then may be short (unseen
    usage settling looks like ours)."""
    if state.unseen_ref is None:
        return state
    settled, unseen_tokens = state.unseen_ref - balance, state.unseen_off
    if unseen_tokens <= 0:
        return replace(state, unseen_ref=None)  # nothing ran unseen (the operator), or no room
    lags = state.lags
    if settled > unseen_tokens:
        # At least `settled − bound` of ours is settled: the API is at most this far behind.
        reached = usage.first_reaching(settled - unseen_tokens)
        at_most = now_ms - (history_start_ms if reached is None else reached)
        if (at_most > max(2 * assumed_lag_ms(state, now_ms, lag_floor_ms), YOUNG_TIGHT_MS)
                and now_ms - history_start_ms < YOUNG_MS):
            # Just crossed: the bound is as loose as our usage was slow to reach `settled − A`,
            # and it would be Δ_assumed for a week. Stay young (the ceiling holds) until a later
            # sync, with more settled, gives a tight bound.
            return state
        # Stored so that Δ_assumed (worst × margin + pad) is this bound, not more: it is no
        # lower bound to pad, and more would hold the pool until the history covers it.
        if at_most > max(assumed_lag_ms(state, now_ms, lag_floor_ms), LAG_PAD_MS):
            lags = (*lags, (now_ms, int((at_most - LAG_PAD_MS) / LAG_MARGIN)))[-50:]
        notes.append(f"the balance API settled {settled:,} tokens since the history began, more than "
                     f"the {unseen_tokens:,} assumed unseen: none of them is pending any more, and "
                     f"the API is at most {at_most // MINUTE_MS} min behind")
    elif now_ms - history_start_ms >= YOUNG_MS:
        notes.append(f"the history is {(now_ms - history_start_ms) // MINUTE_MS} min old: the "
                     f"{unseen_tokens:,} tokens assumed unseen are taken as settled")
    else:
        return state
    bound = state.unseen_ref - unseen_tokens
    if settled > unseen_tokens:
        # Proven: everything unseen settled and the lag is at most `at_most` (now in Δ_assumed),
        # so from here on each estimate is a bound again: the ones seen while young are not kept.
        return replace(state, unseen_ref=None, lowest_free_total=None, anchor_free_total=None,
                       lags=lags)
    lowest = bound if state.lowest_free_total is None else min(state.lowest_free_total, bound)
    return replace(state, unseen_ref=None, lowest_free_total=lowest, anchor_free_total=None, lags=lags)


def _anchor_margin(usage: UsageView, lag_ms: int, floor: int | None, blind: int | None) -> int:
    """How much of our usage a quiet anchor may count as settled that the API has not settled.

    Quiet proves nothing about a lag incident that began within Δ of the traffic stopping: the
    API's settled-through point froze before our last minutes, and with no traffic since no lag
    can be read (an incident five minutes after the stop anchored 90,000 high and billed 39,000,
    red-team, stop 35). Under Δ_assumed the API had settled everything up to Δ_assumed before
    the last usage, so at most what ran after that is missing; and never more than our usage
    beyond the settled floor (which makes the margin 0 once a long night has proven the floor).

    Nor does "the last usage" bound it when the lag observer was blind: it reads a lag only where
    the API settled less than the upper bound of F says, so a freeze hiding less than that
    bound's slack goes unseen whenever it began — one straggler after the batch moved the
    window off the frozen minutes and billed 115,000 (red-team, stop 37, after a busy first
    start). The slack is at most `blind` (the upper bound less the floor's lower bound of F):
    the margin keeps at least that much.
    """
    last = usage.last_change_ms()
    before = None if last is None else usage.usage_before(last - lag_ms)
    since_last = None if before is None else usage.lifetime_usage - before
    wanted = max([m for m in (since_last, blind) if m is not None], default=usage.lifetime_usage)
    beyond_floor = usage.lifetime_usage if floor is None else usage.lifetime_usage - floor
    # Never more than all of it: the anchor less our usage is the balance, which lags low.
    return max(0, min(usage.lifetime_usage, beyond_floor, wanted))


def _lag_behind(usage: UsageView, settled: int, since_ms: int, now_ms: int) -> int | None:
    """How long ago the first minute since `since_ms` ended whose surely-run usage exceeds what
    the API has `settled`: it cannot be settled yet (None: everything may be)."""
    unsettled_from = usage.first_above(settled, since_ms)
    return None if unsettled_from is None else max(0, now_ms - unsettled_from)


def settled_floor(state: LimitState, before: Mapping[str, int], gone: Sequence[str],
                  previous_ms: int, packages: Sequence[PackageView], usage: UsageView) -> int | None:
    """A lower bound of our recorded lifetime usage at the API's settled-through point, whatever
    the lag (docs/limit.md, "The day's count"); None = unknown.

    The API settles in time order, and our count of any stretch is at least what ran in it, so
    each sync raises the last floor by the least the API can have settled since (what the
    packages lost). A new history starts at −A: what ran unseen before it may settle first.
    Nothing else raises it: no age makes usage settled, because no lag is too long to happen
    (a 540-min lag passed the 8-hour ceiling this once assumed and burned 602,908, stop 39).
    """
    chain = _floor_chain(state, before, gone, previous_ms, packages)
    # Never above what we recorded: more settled is usage outside the proxy, not ours.
    return None if chain is None else min(chain, usage.lifetime_usage)


def _floor_chain(state: LimitState, before: Mapping[str, int], gone: Sequence[str],
                 previous_ms: int, packages: Sequence[PackageView]) -> int | None:
    """The last floor raised by what the packages lost since (from −min(A, first balance)), before
    the cap."""
    if not previous_ms:
        return -state.unseen_off  # what ran unseen drew on the first balance at most
    if state.settled_floor is None:
        return None
    return state.settled_floor + _least_settled(before, gone, packages)


def day_step(now_ms: int, packages: Sequence[PackageView], usage: UsageView,
             before: Mapping[str, int], gone: Sequence[str], previous_ms: int, *, lag_ms: int,
             floor_before: int | None, floor: int | None) -> tuple[int | None, int | None]:
    """The day's count (docs/limit.md): the most the API can have settled since the previous
    sync, and our lifetime usage at the API's settled-through point (at most); either None
    when unknown.

    The gate chains the steps into an upper bound of today's consumption up to the API's
    settled-through point and adds what we counted since the second number (everything the
    API may not show yet), so usage we kept whole because nobody reported it (missing usage,
    expired reservations) leaves the daily cap's count only once the floor passes it: when the
    API has shown that much settled, else at midnight. The second number is the proven floor
    (`settled_floor`), never more than our usage Δ_assumed ago: a lag longer than assumed must
    not shrink the count (a 357-min lag burned a million tokens when the count trusted
    Δ_assumed + 40 min alone; a 540-min one burned 602,908 past an 8-hour ceiling).
    A step is the lower of two bounds: per package, what it lost (a new one: its size less what
    is left; one that left the list: all it last showed, expired or not), and what we counted
    since the previous floor, plus what is in flight.
    """
    counted_from = None if floor is None or floor < 0 else floor
    assumed = usage.usage_before(now_ms - lag_ms)
    if counted_from is not None and assumed is not None:
        counted_from = min(counted_from, assumed)
    if not previous_ms:
        return None, counted_from
    ours = None if floor_before is None else max(0, usage.lifetime_usage - floor_before) + usage.inflight
    bounds = [b for b in (_settled_by_packages(before, gone, packages), ours) if b is not None]
    return (min(bounds) if bounds else None), counted_from


def _least_settled(before: Mapping[str, int], gone: Sequence[str],
                   packages: Sequence[PackageView]) -> int:
    """The least the API settled since the previous sync: what the packages it listed then lost,
    and a new package of known size its size less what is left (one that left the list may
    have expired whole, and one back after leaving is not understood: nothing)."""
    total = 0
    for p in packages:
        if p.instance_no in before:
            total += max(0, before[p.instance_no] - p.available)
        elif p.instance_no not in gone and p.total:
            total += max(0, p.total - p.available)
    return total


def _settled_by_packages(before: Mapping[str, int], gone: Sequence[str],
                         packages: Sequence[PackageView]) -> int | None:
    """What the packages lost since the previous sync; None for a package whose loss we cannot
    bound (new, of unknown size; or back after leaving the list)."""
    total = 0
    listed = set()
    for p in packages:
        listed.add(p.instance_no)
        if p.instance_no in before:
            total += max(0, before[p.instance_no] - p.available)
        elif p.instance_no in gone or not p.total:
            return None
        else:
            total += max(0, p.total - p.available)
    return total + sum(avail for i, avail in before.items() if i not in listed)


def _spent(now_ms: int, packages: Sequence[PackageView], usage: UsageView, state: LimitState,
           small_buffer: int, daily_cap: int, max_age_ms: int, evict_below: int,
           notes: list[str]) -> LimitResult:
    """The free quota is used up: a snapshot that admits nothing, and no lag observation."""
    started = not state.billing_since_ms
    state = replace(state, billing_since_ms=state.billing_since_ms or now_ms, last_sync_ms=now_ms,
                    lowest_free_total=None, anchor_free_total=None, least_free_total=None)
    snapshot = Snapshot(balance=0, settled_usage=0, expiring=0, small_buffer=small_buffer,
                        daily_cap=daily_cap, valid_until_ms=now_ms + max_age_ms, evict_below=evict_below)
    lag = assumed_lag_ms(state, now_ms, 0)
    return LimitResult(snapshot, state, 0, 0, 0, lag, None, 0, False, notes,
                       billing=True, billing_started=started)


def _follow_package_changes(state: LimitState, packages: Sequence[PackageView],
                            notes: list[str]) -> LimitState:
    """Carry the free-total estimates across package arrivals and expiries.

    A new package adds its full size to F (consumption only moves tokens from Bal to U); one
    that left the list takes away at most the balance the API last showed for it (lagged, so
    never less than what truly expired). A package that comes back after leaving is not
    understood: the estimates start afresh.
    """
    before = dict(state.packages)
    now = {p.instance_no: p for p in packages}
    seen = [(p.instance_no, p.available) for p in packages]
    if not state.last_sync_ms:
        return replace(state, packages=tuple(seen))
    added = [p for i, p in now.items() if i not in before]
    left = [i for i in before if i not in now]
    gone = (*state.gone, *left)[-200:]
    state = replace(state, packages=tuple(seen), gone=gone)
    if not added and not left:
        return state
    if any(p.instance_no in state.gone for p in added):
        notes.append("a package came back after leaving the list: free-total estimates start afresh")
        return replace(state, lowest_free_total=None, anchor_free_total=None, upper_free_total=None,
                       least_free_total=None)
    delta = sum(p.size for p in added) - sum(before[i] for i in left)
    arrived = sum(p.size for p in added)  # an upper bound of F loses nothing to an expiry
    notes.append(f"packages changed (+{len(added)} / -{len(left)}): free total moves by {delta:+,}")

    def shift(v: int | None) -> int | None:
        return None if v is None else v + delta

    return replace(state, lowest_free_total=shift(state.lowest_free_total),
                   anchor_free_total=shift(state.anchor_free_total), unseen_ref=shift(state.unseen_ref),
                   least_free_total=shift(state.least_free_total),
                   upper_free_total=None if state.upper_free_total is None
                   else state.upper_free_total + arrived)


def next_expiry_ms(packages: Sequence[PackageView], now_ms: int) -> int | None:
    """When the next package with balance left expires (the sync runs again right after)."""
    times = [p.expires_ms for p in packages
             if p.expires_ms is not None and p.expires_ms > now_ms and p.available > 0]
    return min(times) if times else None
