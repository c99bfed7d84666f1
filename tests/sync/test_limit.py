"""The limit's arithmetic on the seed's own numbers (pure, no I/O)."""

from __future__ import annotations

from dataclasses import replace

from volc_quota_guard.limit import (
    LADDER_STEPS,
    LimitState,
    PackageView,
    UsageView,
    assumed_lag_ms,
    compute_limit,
    expiry_ladder,
)

MIN = 60_000
T = 1_786_593_720_000  # 2026-08-13 11:22 Beijing
FLOOR = 20 * MIN


def usage(points: dict[int, int], lifetime: int, inflight: int = 0) -> UsageView:
    """A timeline from {minutes before T: lifetime usage at that minute's end}."""
    minutes = tuple(sorted(((T // MIN) - ago, u) for ago, u in points.items()))
    return UsageView(minutes, 0, lifetime, inflight)


EMPTY = LimitState()


def limit(packages, view, state=EMPTY, now=T, buffer=50_000):
    return compute_limit(now_ms=now, packages=packages, usage=view, state=state, lag_floor_ms=FLOOR,
                         small_buffer=buffer, daily_cap=2_000_000, max_age_ms=90 * MIN, evict_below=1_000)


def test_0813_lag_does_not_inflate_the_free_total():
    """08-13 11:22: v6 read B0 + L = 2,391,794; the lag-compensated estimate stays <= B0 = 2,242,178."""
    # Usage 515,652 by 11:08 (what the API settled), then a 149,616 burst in 14 minutes.
    view = usage({30: 400_000, 21: 480_000, 14: 515_652, 7: 600_000, 1: 665_268}, lifetime=665_268)
    bal = 2_242_178 - 515_652  # the API at 11:22 shows 1,726,526
    r = limit([PackageView("p1", bal, None)], view)
    v6 = bal + 665_268
    assert v6 - 2_242_178 == 149_616
    assert r.free_total <= 2_242_178
    assert r.snapshot.balance + r.snapshot.settled_usage - r.snapshot.small_buffer <= 2_242_178 - 50_000


def test_0812_v4_false_block_numbers_give_headroom():
    """08-12 14:59: U=1,696,135, Bal=596,869 (converged) gives B0 = 2,293,004, not a block."""
    view = usage({90: 1_696_135, 30: 1_696_135, 1: 1_696_135}, lifetime=1_696_135)
    r = limit([PackageView("p1", 596_869, None)], view)
    wall = r.free_total - 50_000
    assert r.free_total == 2_293_004
    assert wall - 1_696_135 == 546_869  # v4 said 296,869 - 1,696,135 < 0: a false block


def test_quiet_stretch_anchors_the_exact_free_total_and_observes_the_lag():
    """After a quiet anchor, the balance locates the API's settled-through point: a 30-min lag is seen."""
    quiet = usage({600: 100_000, 300: 100_000, 1: 100_000}, lifetime=100_000)  # quiet for 10 h
    first = limit([PackageView("p1", 1_900_000, None)], quiet)
    assert first.state.anchor_free_total == 2_000_000
    # 60 minutes of steady traffic, 10k per minute; the API has settled only up to 30 minutes ago.
    later = T + 60 * MIN
    points = {m: 100_000 + (60 - m) * 10_000 for m in range(0, 60)}
    view = UsageView(tuple(sorted(((later // MIN) - ago, u) for ago, u in points.items())), 100_000,
                     lifetime_usage=700_000, inflight=0)
    settled = 100_000 + 30 * 10_000
    r = limit([PackageView("p1", 2_000_000 - settled, None)], view, state=first.state, now=later)
    # A lower bound, to the minute: the settled point lies inside the first unsettled minute.
    assert r.lag_observed_ms is not None and 27 * MIN <= r.lag_observed_ms <= 30 * MIN
    assert assumed_lag_ms(r.state, later, FLOOR) >= 35 * MIN
    # The anchor keeps off only the 100,000 recorded before the first sync (nothing proves it
    # settled); the lag-compensated estimate (1.6M + U(t - 37 min)) undershoots it.
    assert r.free_total == 1_900_000 and r.state.lowest_free_total < 2_000_000


def test_a_quiet_anchor_keeps_the_last_minutes_off_until_the_floor_proves_them():
    """Traffic stops at T - 130 min and a lag incident freezes the API five minutes later, before
    it settled the last 14 minutes (red-team, stop 35: billed 39,000). Quiet for two hours the
    anchor is taken, but the usage in the Δ_assumed (20 min) before the stop stays off the free
    total until the API shows it settled: no quiet stretch proves it (a freeze may last longer)."""
    points = {ago: 100_000 + min(60, 190 - ago) * 10_000 for ago in range(130, 191)}
    points[1] = 700_000
    view = usage(points, lifetime=700_000)
    settled = 100_000 + 46 * 10_000  # through T - 144 min
    packages = [PackageView("p1", 2_000_000 - settled, None)]
    r = limit(packages, view)
    assert r.state.anchor_free_total == 2_000_000 + 140_000  # high by the 14 unsettled minutes
    assert r.state.anchor_margin == 200_000  # the 20 minutes before the stop
    assert r.free_total == 1_940_000 <= 2_000_000
    # Nine hours on, the API still frozen: the margin stays (red-team, stop 38: billed 39,000
    # when an 8-hour floor released it).
    later = T + 9 * 60 * MIN
    r2 = limit(packages, view, state=r.state, now=later)
    assert r2.state.anchor_margin == 200_000 and r2.free_total == 1_940_000
    # The API shows the last 14 minutes: the anchor is exact now, and keeps no more off than
    # before (what it recorded before the first sync is not proven settled: no chain reaches it).
    r3 = limit([PackageView("p1", 1_300_000, None)], view, state=r2.state, now=later + 10 * MIN)
    assert r3.state.anchor_free_total == 2_000_000 and r3.state.anchor_margin <= 200_000


def test_a_straggler_does_not_move_the_margin_off_the_frozen_minutes():
    """The batch stops at T - 130 min and the API freezes at T - 144; one straggler settles at
    T - 121. Measured back from the straggler, the margin covered 111,000 of the 141,000 the API
    had not settled (red-team, stop 37: billed 115,000 after a busy first start). The upper bound
    of F was loose by what was unsettled at the first sync (150,000), so a lag the observer could
    not read may hide that much: the margin keeps it, until the floor proves the rest."""
    points = {ago: 100_000 + min(60, 190 - ago) * 10_000 for ago in range(130, 191)}
    points[121], points[1] = 701_000, 701_000
    view = usage(points, lifetime=701_000)
    balance = 2_000_000 - (100_000 + 46 * 10_000)  # settled through T - 144 min
    state = LimitState(packages=(("p1", balance),), last_sync_ms=T - 30 * MIN, settled_floor=-150_000,
                       upper_free_total=2_150_000, lowest_free_total=2_000_000 - 150_000)
    r = limit([PackageView("p1", balance, None)], view, state=state)
    assert r.state.anchor_free_total == 2_141_000  # high by the 141,000 frozen
    assert r.state.anchor_margin >= 141_000 and r.free_total <= 2_000_000
    # Nine hours on, the API has shown the frozen 141,000 settled, but not the first sync's
    # loose 150,000: the margin stays (no age releases it; a freeze may last longer).
    later = T + 9 * 60 * MIN
    r2 = limit([PackageView("p1", 2_000_000 - 701_000, None)], view, state=r.state, now=later)
    assert r2.state.anchor_margin == r.state.anchor_margin and r2.free_total <= 2_000_000


def test_a_quiet_anchor_after_a_proven_floor_keeps_no_margin():
    """A floor already at our usage (the chain of what the packages lost since a quiet night)
    proves the API settled everything: the anchor is exact and nothing is kept off."""
    state = LimitState(packages=(("p1", 1_500_000),), last_sync_ms=T - 30 * MIN, settled_floor=400_000)
    points = {ago: 400_000 + min(20, 160 - ago) * 5_000 for ago in range(140, 161)}
    points[1] = 500_000
    r = limit([PackageView("p1", 1_400_000, None)], usage(points, lifetime=500_000), state=state)
    assert r.state.anchor_free_total == 1_900_000
    assert r.state.anchor_margin == 0 and r.free_total == 1_900_000


def test_a_lag_is_observed_without_a_quiet_stretch():
    """Traffic never pauses for two hours, so no exact anchor exists; the lowest upper bound of
    the free total a sync saw (balance + usage + in flight: the first sync, before any traffic)
    still locates a lower bound of a 45-minute lag, over the 20-minute floor (fuzz seed 381: the
    lag went unseen, a wipe then trusted Δ = 20 min, and the guard billed 179,069)."""
    busy = usage({1: 0}, lifetime=0, inflight=50_000)  # a first sync, traffic already in flight
    first = limit([PackageView("p1", 2_000_000, None)], busy)
    assert first.state.anchor_free_total is None and first.state.upper_free_total == 2_050_000
    later = T + 90 * MIN
    points = {m: (90 - m) * 10_000 for m in range(0, 90)}  # 10k a minute, never quiet
    view = UsageView(tuple(sorted(((later // MIN) - ago, u) for ago, u in points.items())), 0,
                     lifetime_usage=900_000, inflight=50_000)
    settled = 45 * 10_000  # the API is 45 minutes behind
    r = limit([PackageView("p1", 2_000_000 - settled, None)], view, state=first.state, now=later)
    assert r.state.anchor_free_total is None
    # A lower bound: the in flight at the first sync may not have run, so it reads ~40 minutes.
    assert r.lag_observed_ms is not None and 38 * MIN <= r.lag_observed_ms <= 45 * MIN
    assert assumed_lag_ms(r.state, later, FLOOR) >= 45 * MIN
    # The bound is never the wall's free total; the floor (the packages lost 450,000, all ours
    # here: no unseen usage before the history) proves the true one, 2,000,000, at most.
    assert r.free_total <= 2_000_000


def test_reservations_kept_whole_do_not_read_as_lag():
    """The same 30-min lag, but the first 10 minutes of the hour also hold 400,000 of reservations
    kept whole (usage never reported; 40,000 really ran): judged by our whole count the API would
    look 55 minutes behind, so the observer reads what surely ran, and sees ~30 minutes."""
    quiet = usage({300: 100_000, 1: 100_000}, lifetime=100_000)
    first = limit([PackageView("p1", 1_900_000, None)], quiet)
    later = T + 60 * MIN
    minutes, unsure = [], []
    for ago in range(59, -1, -1):
        kept = min(60 - ago, 10) * 40_000  # 40,000 a minute kept whole for 10 minutes
        minutes.append((later // MIN - ago, 100_000 + (60 - ago) * 10_000 + kept))
        unsure.append(kept)
    view = UsageView(tuple(minutes), 100_000, lifetime_usage=minutes[-1][1], inflight=0,
                     unsure=tuple(unsure))
    settled = 100_000 + 30 * 10_000  # the API: measured usage only (what really ran, 10k a minute)
    r = limit([PackageView("p1", 2_000_000 - settled, None)], view, state=first.state, now=later)
    assert r.lag_observed_ms is not None and 27 * MIN <= r.lag_observed_ms <= 30 * MIN
    blind = UsageView(tuple(minutes), 100_000, lifetime_usage=minutes[-1][1], inflight=0)
    r = limit([PackageView("p1", 2_000_000 - settled, None)], blind, state=first.state, now=later)
    assert r.lag_observed_ms is not None and r.lag_observed_ms >= 50 * MIN


def test_a_return_package_moves_the_estimates_by_its_size():
    """A new package adds its full size to the free total; anchor and observed lags carry over."""
    state = LimitState(packages=(("p1", 300_000),), anchor_free_total=1_000_000, anchor_ms=T - 200 * MIN,
                       lowest_free_total=990_000, lags=((T - MIN, 30 * MIN),), last_sync_ms=T - 10 * MIN)
    view = usage({120: 500_000, 45: 600_000, 1: 700_000}, lifetime=700_000)
    r = limit([PackageView("p1", 300_000, None), PackageView("p2", 1_500_000, None, 1_500_000)], view,
              state=state)
    assert r.state.anchor_free_total == 2_500_000 and r.state.lags == state.lags
    assert r.free_total == 2_500_000
    assert r.state.lowest_free_total == min(990_000 + 1_500_000, 1_800_000 + 600_000)


def test_an_expired_package_takes_away_its_last_seen_balance():
    """A package that left the list lowers the free total by the balance the API last showed."""
    state = LimitState(packages=(("old", 120_000), ("p1", 900_000)), anchor_free_total=1_500_000,
                       lowest_free_total=1_500_000, last_sync_ms=T - 30 * MIN)
    view = usage({60: 480_000, 1: 480_000}, lifetime=480_000)
    r = limit([PackageView("p1", 900_000, None)], view, state=state)
    assert r.free_total == 1_380_000 and r.state.gone == ("old",)


def test_a_package_that_comes_back_resets_the_estimates():
    """A package seen leaving and then listed again is not trusted: estimates start afresh."""
    state = LimitState(packages=(("p1", 900_000),), gone=("old",), anchor_free_total=1_500_000,
                       lowest_free_total=1_500_000, last_sync_ms=T - 30 * MIN)
    view = usage({60: 480_000, 21: 500_000, 1: 520_000}, lifetime=520_000, inflight=1)
    r = limit([PackageView("p1", 900_000, None), PackageView("old", 100_000, None)], view, state=state)
    assert r.state.anchor_free_total is None
    assert r.free_total == 1_000_000 + 500_000  # Bal + U(t - 20 min), nothing carried over


def test_lowest_estimate_is_kept_while_the_set_is_unchanged():
    """Between syncs with the same packages the lowest free-total estimate wins."""
    state = LimitState(packages=(("p1", 1_900_000),), lowest_free_total=1_950_000, last_sync_ms=T - MIN)
    view = usage({60: 100_000, 1: 200_000}, lifetime=200_000)
    r = limit([PackageView("p1", 1_900_000, None)], view, state=state)
    assert r.free_total == 1_950_000


def test_packages_expiring_before_the_snapshot_do_are_taken_off():
    """Free tokens in a package that expires within the snapshot's life are not counted."""
    view = usage({300: 0}, lifetime=0)
    r = limit([PackageView("old", 400_000, T + 60 * MIN), PackageView("new", 1_200_000, T + 30 * 86_400_000)],
              view)
    assert r.expiring == 400_000
    assert r.snapshot.balance + r.snapshot.settled_usage - r.expiring - 50_000 == 1_150_000


def test_later_expiries_go_on_the_ladder_soonest_first():
    """A package expiring after the snapshot's own lookahead (validity + the longest call) stays
    on the wall, and on the ladder a call Ark may run past it is reserved against; one with
    nothing left, or none expiring, is not on it."""
    view = usage({300: 0}, lifetime=0)
    day = 86_400_000
    packages = [PackageView("soon", 100_000, T + 60 * MIN), PackageView("later", 200_000, T + 5 * 60 * MIN),
                PackageView("first", 300_000, T + 4 * 60 * MIN), PackageView("dry", 0, T + 6 * 60 * MIN),
                PackageView("month", 400_000, T + 30 * day), PackageView("open", 500_000, None)]
    r = compute_limit(now_ms=T, packages=packages, usage=view, state=EMPTY, lag_floor_ms=FLOOR,
                      small_buffer=50_000, daily_cap=2_000_000, max_age_ms=90 * MIN, evict_below=1_000,
                      running_ms=115 * MIN)
    assert r.expiring == 100_000  # by T + 90 + 115 min
    assert r.snapshot.ladder == ((T + 4 * 60 * MIN, 300_000), (T + 5 * 60 * MIN, 200_000),
                                 (T + 30 * day, 400_000))


def test_a_long_ladder_merges_its_tail_into_its_last_step():
    """Past LADDER_STEPS the later packages are merged into the last step: taken off a call that
    reaches it, which only ever takes more off."""
    packages = [PackageView(f"p{i}", 1_000, T + (i + 1) * 86_400_000) for i in range(LADDER_STEPS + 5)]
    steps = expiry_ladder(packages, T)
    assert len(steps) == LADDER_STEPS and sum(a for _, a in steps) == 1_000 * (LADDER_STEPS + 5)
    assert steps[-1] == (T + LADDER_STEPS * 86_400_000, 6_000)


def test_balance_drop_beyond_recorded_usage_is_flagged():
    """If the API settled more than we ever recorded, usage bypassed the proxy: say so."""
    state = LimitState(packages=(("p1", 1_800_000),), anchor_free_total=2_000_000, anchor_ms=T - 60 * MIN,
                       last_sync_ms=T - 10 * MIN)
    view = usage({30: 100_000, 1: 100_000}, lifetime=100_000, inflight=5)
    r = limit([PackageView("p1", 1_700_000, None)], view, state=state)
    assert r.external_usage and any("outside the proxy" in n for n in r.notes)
    assert r.free_total <= 1_700_000 + 100_000


def test_a_lag_of_hours_behind_an_anchor_drops_the_anchor():
    """A settled-through point hours behind the anchor more likely means the anchor is low (an
    expiry shift): it is flagged, kept only as a bound of F, and no lag is taken from it."""
    state = LimitState(packages=(("p1", 1_000_000),), anchor_free_total=1_500_000,
                       anchor_ms=T - 20 * 60 * MIN, last_sync_ms=T - 10 * MIN)
    # Steady usage for 6 hours; the balance says only 100,000 was ever settled (5 h 40 min ago).
    points = {m: 100_000 + (360 - m) * 1_000 for m in range(0, 360, 5)}
    r = limit([PackageView("p1", 1_400_000, None)], usage(points, lifetime=460_000, inflight=1), state=state)
    assert r.state.anchor_free_total is None and r.free_total <= 1_500_000
    assert any("behind the anchor" in n for n in r.notes)


def steady(hours: int, per_minute: int, now: int) -> UsageView:
    """Usage of `per_minute` every minute for `hours` up to `now` (lifetime from 0)."""
    span = hours * 60
    return UsageView(tuple((now // MIN - ago, (span - ago) * per_minute) for ago in range(span, -1, -1)),
                     0, span * per_minute, 0)


def test_a_quiet_stretch_shorter_than_the_assumed_lag_gives_no_anchor():
    """The API was seen 150 minutes behind; two quiet hours then prove nothing — the last half
    hour before them is unsettled still (the api-lag-150-min scenario: billed 205,000)."""
    state = LimitState(lags=((T - 60 * MIN, 150 * MIN),), last_sync_ms=T - 10 * MIN)
    view = usage({300: 0, 200: 300_000, 130: 400_000, 1: 400_000}, lifetime=400_000)
    r = limit([PackageView("p1", 1_700_000, None)], view, state=state)
    assert assumed_lag_ms(state, T, FLOOR) > 180 * MIN
    assert r.state.anchor_free_total is None
    assert r.free_total <= 1_700_000 + 300_000  # Bal + U(t − Δ_assumed), not Bal + U(now)
    # Quiet for longer than Δ_assumed, it anchors.
    long_quiet = usage({400: 0, 300: 400_000, 1: 400_000}, lifetime=400_000)
    anchored = limit([PackageView("p1", 1_600_000, None)], long_quiet, state=state)
    assert anchored.state.anchor_free_total == 2_000_000


def test_a_lag_of_hours_against_the_upper_bound_is_planned_around():
    """No anchor; the lowest upper bound of F says the API is 6 hours behind (an incident at
    Volcengine). That is a lower bound of the true lag however long: adopted, never disbelieved
    (fuzz seed 12: a 445-minute lag dropped as unbelievable burned 1,429,499)."""
    start = T - 8 * 60 * MIN
    first = limit([PackageView("p1", 3_000_000, None)], usage({481: 0}, lifetime=0, inflight=1_000),
                  now=start)
    assert first.state.upper_free_total == 3_001_000
    view = steady(8, 1_000, T)  # 480,000 over 8 hours
    r = limit([PackageView("p1", 3_000_000 - 120_000, None)], view, state=first.state)
    assert r.lag_observed_ms is not None and r.lag_observed_ms >= 5 * 60 * MIN
    assert r.lag_assumed_ms >= 6 * 60 * MIN
    assert r.free_total <= 3_000_000


def test_a_package_run_dry_means_billing_an_expired_one_does_not():
    """Bal = 0 because a package with tokens ran dry (still listed at 0) is billing; Bal = 0 because
    the only package with tokens left the list (expired) is not; a new package ends it afresh."""
    view = usage({60: 100_000, 1: 400_000}, lifetime=400_000)
    first = limit([PackageView("old", 0, None), PackageView("p1", 300_000, None)], view)
    assert not first.billing
    dry = limit([PackageView("old", 0, None), PackageView("p1", 0, None)], view, state=first.state,
                now=T + 10 * MIN)
    assert dry.billing and dry.billing_started and dry.lag_observed_ms is None
    s = dry.snapshot
    assert s.balance + s.settled_usage - s.expiring - s.small_buffer < 0, "the pool must close"
    again = limit([PackageView("old", 0, None), PackageView("p1", 0, None)], view, state=dry.state,
                  now=T + 20 * MIN)
    assert again.billing and not again.billing_started
    back = limit([PackageView("old", 0, None), PackageView("p1", 0, None), PackageView("p2", 500_000, None)],
                 view, state=again.state, now=T + 30 * MIN)
    assert not back.billing and back.state.billing_since_ms == 0
    assert back.free_total <= 500_000 + 400_000  # afresh: Bal + U(t − Δ), never the stale anchor

    expired = limit([PackageView("old", 0, None)], view, state=first.state, now=T + 10 * MIN)
    assert not expired.billing


def young(packages, view, state=EMPTY, now=T, hist=T, unseen=200_000, lost=False):
    """A limit on a history that began at `hist` (a first start, or `lost` state), the unseen
    bound on."""
    return compute_limit(now_ms=now, packages=packages, usage=view, state=state, lag_floor_ms=FLOOR,
                         small_buffer=50_000, daily_cap=2_000_000, max_age_ms=90 * MIN,
                         evict_below=1_000, history_start_ms=hist, unseen_tokens=unseen, lost=lost)


def test_a_young_history_keeps_unseen_usage_off_the_wall_until_the_api_settles_past_it():
    """180,000 tokens ran on Ark just before a first start and the API is 5 hours behind: a
    hold of Δ_assumed (20 min) would end with none of it shown. The wall keeps the 200,000 unseen
    bound off from the first sync — the prior-usage-long-lag scenario billed 124,400 without
    it — until the API has settled more than the bound since the history began (then some of
    ours is settled, and all before it). With the bound on, the pool is not held."""
    first = young([PackageView("p1", 600_000, None)], usage({1: 0}, lifetime=0))
    assert first.held_until_ms == 0 and first.state.unseen_ref == 600_000
    s0 = first.snapshot
    assert (s0.hold_until_ms, s0.expiring) == (0, 200_000)
    assert s0.balance + s0.settled_usage - s0.expiring - s0.small_buffer == 600_000 - 250_000
    later = T + 30 * MIN
    view = steady(0, 0, later)  # nothing of ours ran yet
    r = young([PackageView("p1", 600_000, None)], view, state=first.state, now=later)
    assert r.held_until_ms == 0 and r.unseen == 200_000
    assert r.snapshot.expiring == 200_000  # kept off the wall with what expires
    wall = r.snapshot.balance + r.snapshot.settled_usage - r.snapshot.expiring - r.snapshot.small_buffer
    assert wall <= 600_000 - 180_000 - 50_000
    # Without the bound (an account the operator knows was idle), the old wall: it would bill.
    idle_first = young([PackageView("p1", 600_000, None)], usage({1: 0}, lifetime=0), unseen=0)
    assert idle_first.held_until_ms == T + 20 * MIN  # no bound: held until Δ_assumed is covered
    idle = young([PackageView("p1", 600_000, None)], view, state=idle_first.state, now=later, unseen=0)
    assert idle.unseen == 0 and idle.snapshot.expiring == 0

    # The API settles 150,000 (unseen or ours, it cannot say): the free total is still at most
    # the first balance less the bound, whatever the lag — kept off the balance it sees.
    then = later + 60 * MIN
    ours = UsageView(tuple((T // MIN + 30 + i, 4_000 * i) for i in range(11)), 0, 40_000, 0)
    part = young([PackageView("p1", 450_000, None)], ours, state=r.state, now=then)
    assert part.free_total == 400_000 and part.unseen == 50_000
    # More than the bound settled since the history began: nothing unseen is pending any more,
    # and at least 10,000 of ours is settled (reached in the minute from T+33). At T+100 that
    # bounds the lag by 67 min only: too loose to keep as Δ_assumed for a week (a 182-min bound
    # against a true 14 let 170,300 free tokens expire), so the history stays young.
    loose = young([PackageView("p1", 390_000, None)], ours, state=part.state, now=then + 10 * MIN)
    assert loose.state.unseen_ref == 600_000 and loose.free_total <= 400_000
    # At T+93 the same settled usage bounds it by 60 min: tight enough, Δ_assumed is that bound,
    # no more (more would hold the pool again).
    done = young([PackageView("p1", 390_000, None)], ours, state=part.state, now=then + 3 * MIN)
    assert done.unseen == 0 and done.state.unseen_ref is None and done.held_until_ms == 0
    assert any("210,000 tokens since the history began" in n and "at most 60 min" in n
               for n in done.notes)
    assert 59 * MIN <= done.lag_assumed_ms <= 60 * MIN
    assert done.free_total <= 400_000  # the bound stays the lowest estimate's ceiling


def test_a_young_history_too_small_to_prove_itself_ends_after_hours():
    """A pool whose balance cannot show more than the bound settled ends young after YOUNG_MS
    (8 h), and gets the unseen tokens back from a quiet stretch only UNSEEN_SETTLED_MS (25 h)
    after its history began: before, the balance may still not show them (a quiet anchor at 8 h
    under a 702-min lag billed 27,921, fuzz seed 1119). A new package moves the reference with
    the free total, so its arrival proves nothing."""
    two = [PackageView("p1", 150_000, None), PackageView("p2", 500_000, None, total=500_000)]
    first = young([PackageView("p1", 150_000, None)], usage({1: 0}, lifetime=0))
    view = usage({1: 0}, lifetime=0)
    added = young(two, view, state=first.state, now=T + 60 * MIN)
    # The bound is 200,000, but what ran unseen can have taken no more than the first 150,000.
    assert added.unseen == 150_000 and added.state.unseen_ref == 650_000
    still = young(two, view, state=added.state, now=T + 479 * MIN)
    assert still.unseen == 150_000
    over = young(two, view, state=still.state, now=T + 480 * MIN)
    assert over.state.unseen_ref is None and any("480 min old" in n for n in over.notes)
    assert over.unseen == 150_000  # quiet for 8 hours, but no anchor yet
    assert over.state.unseen_kept == 150_000  # status and a lost generation's bound read it
    day = young(two, view, state=over.state, now=T + 1499 * MIN)
    assert day.unseen == 150_000
    back = young(two, view, state=day.state, now=T + 1500 * MIN)
    assert back.unseen == 0 and back.free_total == 650_000 and back.state.unseen_kept == 0


def test_what_a_young_history_saw_does_not_outlive_it():
    """Red-team findings on the first young-history rule (billed 67,300-130,000 with unseen usage
    under the bound and lags of 2-3.3 h): while young, a quiet stretch takes no exact anchor (the
    balance may still hold the unseen usage), the free total is at most the first balance less
    the bound whatever the lag, and that bound stays the lowest estimate's ceiling after."""
    first = young([PackageView("p1", 480_000, None)], usage({1: 0}, lifetime=0))
    # Three quiet hours with nothing of ours: no anchor while young (the balance is 180k high).
    quiet = young([PackageView("p1", 480_000, None)], usage({1: 0}, lifetime=0), state=first.state,
                  now=T + 180 * MIN)
    assert quiet.state.anchor_free_total is None and quiet.free_total == 280_000
    assert quiet.snapshot.balance - quiet.snapshot.expiring == 280_000
    # Our 1,000 a minute from T+180 while the API settles 150,000 of the unseen usage: read as
    # ours it says the API is barely behind; the bound does not depend on it.
    later = T + 300 * MIN
    points = {m: (120 - m) * 1_000 for m in range(0, 120)}
    view = UsageView(tuple(sorted(((later // MIN) - ago, u) for ago, u in points.items())), 0,
                     lifetime_usage=120_000, inflight=0)
    r = young([PackageView("p1", 330_000, None)], view, state=quiet.state, now=later)
    assert r.free_total <= 280_000
    # The API settled past the bound, but 10,000 of ours was reached 2 h ago: a loose lag bound,
    # so the history stays young until a tight one or its 8 h end; then a later quiet stretch may
    # anchor again (the state is no longer young).
    loose = young([PackageView("p1", 270_000, None)], view, state=r.state, now=later + 10 * MIN)
    assert loose.state.unseen_ref is not None and loose.free_total <= 280_000
    done = young([PackageView("p1", 270_000, None)], view, state=loose.state, now=T + 480 * MIN)
    assert done.state.unseen_ref is None and done.state.lowest_free_total <= 280_000


def _timeline(start_ms: int, per_minute: dict[int, int]) -> tuple[tuple[int, int], ...]:
    """{minutes after `start_ms`: tokens used in that minute} as a lifetime timeline."""
    out, total = [], 0
    for m in range(max(per_minute) + 1):
        total += per_minute.get(m, 0)
        out.append((start_ms // MIN + m, total))
    return tuple(out)


def test_a_first_start_keeps_its_first_balance_less_the_unseen_bound_as_a_floor():
    """What ran unseen before a first start took at most A (VQG_UNSEEN_DAY_TOKENS), so the free
    total is at least the first balance less A whatever the lag, and stays so after the history
    is no longer young. A lowest estimate taken after a burst undershoots it (the traffic between
    the true lag and Δ_assumed): 540,000 where the pool had 1,000,000 free and nothing ran
    unseen; the floor keeps 800,000. Not for a lost history (its A holds only what processes
    reported), nor once the packages lost more than A plus all we recorded."""
    pool = [PackageView("p1", 1_000_000, None)]
    first = young(pool, usage({1: 0}, lifetime=0))
    assert first.state.least_free_total == 800_000 and first.free_total == 800_000
    # 10,000 a minute for an hour, the API 5 min behind: at T+60 it has settled 550,000, more
    # than A, 350,000 of ours (reached in the minute from T+34): young ends, Δ_assumed 26 min.
    steady_hour = {m: 10_000 for m in range(60)}
    view = UsageView(_timeline(T, steady_hour), 0, 600_000, 0)
    ended = young([PackageView("p1", 450_000, None)], view, state=first.state, now=T + 60 * MIN)
    assert ended.state.unseen_ref is None and ended.lag_assumed_ms == 26 * MIN
    assert ended.state.lowest_free_total == 450_000 + 340_000  # its estimate: U(T+34) = 340,000
    assert ended.free_total == 800_000
    # A 300,000 burst at T+64; at T+70 the API (5 min behind) shows it: the estimate
    # 100,000 + U(T+44) = 540,000 becomes the lowest, the floor holds 800,000.
    burst = UsageView(_timeline(T, steady_hour | {64: 300_000}), 0, 900_000, 0)
    after = young([PackageView("p1", 100_000, None)], burst, state=ended.state, now=T + 70 * MIN)
    assert after.state.lowest_free_total == 540_000
    assert after.free_total == 800_000 and after.unseen == 0
    # A lost history: A is only what the processes reported (one that never did may have
    # admitted more), so no floor; the lowest estimate decides.
    lost = young(pool, usage({1: 0}, lifetime=0), lost=True)
    assert lost.state.least_free_total is None
    # The premise proven false (the packages lost more than A plus all we recorded): dropped.
    over = young([PackageView("p1", 40_000, None)], burst,
                 state=replace(after.state, settled_floor=850_000), now=T + 75 * MIN)
    assert over.state.floor_overrun and over.state.least_free_total is None
    assert over.free_total == 40_000 + 490_000  # the lowest estimate: U(T+49) = 490,000
    assert LimitState.from_json(after.state.to_json()).least_free_total == 800_000


def test_the_settled_floor_starts_below_what_may_have_run_unseen_and_follows_later_reports():
    """The settled floor starts at minus what may have run unseen (at most the first balance: a
    free balance stops at 0). A lost history's bound grows with each process's report; what a
    report adds may have settled before any of ours, so the floor goes down with it (else the
    day's count and the anchor's margin would trust as ours what another process ran)."""
    small = young([PackageView("p1", 120_000, None)], usage({1: 0}, lifetime=0))
    assert small.state.settled_floor == -120_000  # not −200,000: only 120,000 was there to draw on
    nothing = usage({1: 0}, lifetime=0)
    first = young([PackageView("p1", 1_000_000, None)], nothing, unseen=70_000, lost=True)
    assert first.state.settled_floor == -70_000
    # Another process reports 200,000 unsettled; the packages lost 30,000 since.
    later = young([PackageView("p1", 970_000, None)], nothing, state=first.state, now=T + MIN, lost=True)
    assert later.state.unseen_bound == 200_000
    assert later.state.settled_floor == -200_000 + 30_000


def test_the_floor_frees_what_a_lowest_estimate_taken_mid_burst_keeps_off():
    """The lowest estimate (1,950,000) was taken while a burst the API had already settled was
    still inside Δ_assumed, and it holds while the package set does not change. This sync's
    estimate (balance + U(t − 377 min)) is a bound unless the lag grew past Δ_assumed; the settled
    floor (what the packages lost) is one whatever the lag, unless usage outside the proxy lost
    some of it: F ≥ balance + the least of the two, a bound while either holds (fuzz seed 6)."""
    view = steady(10, 1_000, T)  # 600,000 over 10 hours, 1,000 a minute
    state = LimitState(lags=((T - 60 * MIN, 300 * MIN),), last_sync_ms=T - 10 * MIN,
                       packages=(("p1", 2_000_000),), lowest_free_total=1_950_000, settled_floor=250_000)
    r = limit([PackageView("p1", 1_900_000, None)], view, state=state)
    assert r.state.settled_floor == 350_000 and r.lag_assumed_ms == 377 * MIN
    assert r.state.lowest_free_total == 1_950_000
    # The estimate (its last complete minute: U = 222,000) is below the floor: it decides.
    assert r.free_total == 1_900_000 + 222_000
    # A floor below it decides instead.
    low = limit([PackageView("p1", 1_990_000, None)], view, state=replace(state, settled_floor=100_000))
    assert low.state.settled_floor == 110_000
    assert low.free_total == 1_990_000 + 110_000
    # No floor (unknown): the lowest estimate, as before.
    unknown = limit([PackageView("p1", 1_900_000, None)], view, state=replace(state, settled_floor=None))
    assert unknown.free_total == 1_950_000


def test_the_floor_hedge_keeps_a_second_unseen_bound_off_and_ends_when_the_floor_overruns():
    """The floor is a bound only if at most A ran unseen before the history (and nothing outside
    the proxy): a second A stays off it, so up to 2A unseen leaves it one (red-team: 350,000 unseen
    under A = 200,000 and a lag incident billed 90,000 without it). Packages that lost more than A
    plus all we recorded prove that premise false: no hedge for the rest of the history."""
    view = steady(10, 1_000, T)
    state = LimitState(lags=((T - 60 * MIN, 300 * MIN),), last_sync_ms=T - 10 * MIN,
                       packages=(("p1", 2_000_000),), lowest_free_total=1_950_000,
                       settled_floor=100_000, unseen_bound=100_000)
    r = limit([PackageView("p1", 1_990_000, None)], view, state=state)
    assert r.free_total == 1_990_000 + 110_000 - 100_000
    over = limit([PackageView("p1", 1_900_000, None)], view, state=replace(state, settled_floor=590_000))
    assert over.state.floor_overrun and over.state.settled_floor == 600_000  # capped: all we recorded
    assert over.free_total == 1_950_000
    later = limit([PackageView("p1", 1_900_000, None)], view,
                  state=replace(over.state, last_sync_ms=T - 5 * MIN), now=T)
    assert later.state.floor_overrun and later.free_total == 1_950_000
    assert LimitState.from_json(over.state.to_json()).floor_overrun


def test_a_free_total_below_the_balance_stays_off_the_wall_after_a_young_history():
    """The young ceiling stays the lowest estimate after the history is no longer young; where it
    is below the balance (the API still shows none of what ran unseen) the wall keeps the
    difference off. Clamped at the balance, it let a 777-min lag bill 18,202 (fuzz seed 729)."""
    state = LimitState(lowest_free_total=400_174, last_sync_ms=T - 10 * MIN, packages=(("p1", 600_174),),
                       unseen_bound=200_000)
    r = limit([PackageView("p1", 600_174, None)], steady(10, 500, T), state=state)  # never quiet
    assert r.free_total == 400_174 and r.unseen == 200_000
    snap = r.snapshot
    assert snap.balance + snap.settled_usage - snap.expiring - snap.small_buffer == 350_174
