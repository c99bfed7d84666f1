"""The gate's verbs, on the test backend (real Redis in CI, the embedded store elsewhere)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import redis

from volc_quota_guard.clock import ManualClock, next_beijing_midnight_ms
from volc_quota_guard.errors import GateError, StoreUnavailable
from volc_quota_guard.gate import Gate, Snapshot
from volc_quota_guard.gate.keys import KeySpace, pool_id
from volc_quota_guard.gate.store import connect

POOL = pool_id("acct-a", "deepseek-v4-flash-ga-260731")
POOL_B = pool_id("acct-b", "deepseek-v4-flash-ga-260731")
T0 = 1_786_600_000_000  # 2026-08-13 13:46 Beijing


def snap(clock: ManualClock, balance: int = 1_000_000, settled: int = 0, expiring: int = 0,
         buffer: int = 50_000, cap: int = 2_000_000, minutes: int = 60) -> Snapshot:
    return Snapshot(balance, settled, expiring, buffer, cap, clock.now_ms() + minutes * 60_000, 1_000)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def gate(client: redis.Redis, keyspace: KeySpace, clock: ManualClock) -> Gate:
    return Gate(client, keyspace, clock)


def test_pool_without_snapshot_admits_nothing_and_writes_nothing(gate, client, keyspace):
    """Fail closed: no snapshot means a refusal that says so, and no key is created."""
    d = gate.reserve(POOL, "r1", 100)
    assert (d.status, d.reason) == ("refused", "no_snapshot")
    assert list(client.scan_iter(f"{keyspace.prefix}:*")) == []
    with pytest.raises(GateError) as exc:
        gate.settle(POOL, "r1", 10)
    assert exc.value.code == "unknown_pool"


def test_balance_wall_counts_inflight_and_clamps_to_headroom(gate, clock):
    """Reservations add up against Bal + settled - buffer; the last one is clamped to what is left."""
    gate.install_snapshot(POOL, snap(clock, balance=1_000_000, buffer=50_000))
    assert gate.reserve(POOL, "a", 600_000).amount == 600_000
    d = gate.reserve(POOL, "b", 600_000, least=100_000)
    assert (d.reason, d.amount) == ("admitted", 350_000)
    d = gate.reserve(POOL, "c", 10, least=10)
    assert (d.status, d.reason) == ("refused", "balance_wall")
    assert d.usage_and_limit() == (950_000, 950_000)


def test_collection_wall_is_per_beijing_day(gate, clock):
    """Today's usage is capped; after Beijing midnight the cap is available again."""
    gate.install_snapshot(POOL, snap(clock, balance=10_000_000, cap=100_000, minutes=24 * 60))
    gate.reserve(POOL, "a", 90_000)
    gate.settle(POOL, "a", 90_000)
    d = gate.reserve(POOL, "b", 20_000)
    assert d.reason == "collection_wall" and d.evicted_until == 0  # 10k left: small calls fit
    d = gate.settle(POOL, "c", 9_500)
    assert d.evicted_until == next_beijing_midnight_ms(T0)  # under evict_below: out of routing
    clock.set(next_beijing_midnight_ms(T0) + 1)
    d = gate.reserve(POOL, "b", 20_000)
    assert d.reason == "admitted" and d.used_today == 20_000 and d.used_balance == 119_500


def test_settle_replaces_reservation_and_is_idempotent(gate, clock):
    """A retried settle does not double count; lifetime and day counters take the real usage."""
    gate.install_snapshot(POOL, snap(clock))
    gate.reserve(POOL, "a", 5_000)
    first = gate.settle(POOL, "a", 1_234)
    again = gate.settle(POOL, "a", 1_234)
    assert (first.reason, first.amount, first.inflight) == ("settled", 1_234, 0)
    assert (again.reason, again.amount, again.used_balance) == ("duplicate", 0, 1_234)


def test_reserve_is_idempotent_per_request_id(gate, clock):
    """The same id twice (LiteLLM can run its deployment hook twice) holds one reservation."""
    gate.install_snapshot(POOL, snap(clock))
    gate.reserve(POOL, "a", 5_000)
    d = gate.reserve(POOL, "a", 9_000)
    assert (d.reason, d.amount, d.inflight) == ("duplicate", 5_000, 5_000)


def test_unknown_usage_keeps_the_reservation_as_consumed(gate, clock):
    """settle(None): usage unavailable, so the whole reservation counts (fail closed)."""
    gate.install_snapshot(POOL, snap(clock))
    gate.reserve(POOL, "a", 7_000)
    d = gate.settle(POOL, "a", None)
    assert (d.amount, d.used_balance) == (7_000, 7_000)


def test_expired_reservation_counts_as_consumed_then_late_settle_tops_up_once(gate, clock):
    """A reservation past its deadline is consumed; a late settle only adds what it exceeded."""
    gate.install_snapshot(POOL, snap(clock, minutes=120))
    gate.reserve(POOL, "a", 5_000, ttl_ms=60_000)
    clock.advance(61_000)
    d = gate.status(POOL).decision
    assert (d.inflight, d.used_balance) == (0, 5_000)
    late = gate.settle(POOL, "a", 6_500)
    assert (late.reason, late.amount, late.used_balance) == ("late_settle", 1_500, 6_500)
    assert gate.settle(POOL, "a", 6_500).reason == "duplicate"
    assert gate.status(POOL).get("expired_count") == 1


def test_a_dead_process_reservation_expiring_near_midnight_counts_on_the_next_day_too(gate, clock):
    """Only a dead process's reservation expires (a live one renews), and its call may still run
    at Ark past Beijing midnight and be billed on the new day: within 6 h of midnight it counts on
    both days; at midday it does not carry."""
    midnight = next_beijing_midnight_ms(T0)
    clock.set(midnight - 2 * 3_600_000)
    gate.install_snapshot(POOL, snap(clock, balance=10_000_000, cap=100_000, minutes=24 * 60))
    gate.reserve(POOL, "late", 30_000, ttl_ms=60_000)
    clock.advance(61_000)
    assert gate.status(POOL).decision.used_today == 30_000
    clock.set(midnight + 60_000)
    d = gate.reserve(POOL, "next", 80_000, least=80_000)
    assert (d.status, d.reason) == ("refused", "collection_wall")
    assert gate.reserve(POOL, "fits", 60_000).used_today == 90_000
    clock.set(midnight + 12 * 3_600_000)
    assert gate.reserve(POOL, "noon", 5_000, ttl_ms=60_000).reason == "admitted"
    clock.advance(61_000)
    assert gate.status(POOL).decision.used_today == 95_000
    clock.set(midnight + 86_400_000 + 60_000)
    assert gate.status(POOL).decision.used_today == 0


def test_release_frees_headroom_and_unknown_settle_counts_once(gate, clock):
    """Release gives the reservation back; a settle for an id never reserved is counted once."""
    gate.install_snapshot(POOL, snap(clock))
    gate.reserve(POOL, "a", 5_000)
    assert gate.release(POOL, "a").amount == 5_000
    assert gate.release(POOL, "a").reason == "duplicate"
    assert gate.settle(POOL, "ghost", 300).reason == "unreserved"
    assert gate.settle(POOL, "ghost", 300).reason == "duplicate"
    assert gate.status(POOL).decision.used_balance == 300


def test_a_reserve_landing_after_its_release_finds_it_resolved(gate, clock):
    """A reserve whose answer was lost is released by the hook; if the reserve itself reaches the
    store only after that (a slow connection), it must not hold tokens nobody will settle: the
    release marked the id (a red-team pass left 3,156 tokens orphaned in a timeout storm)."""
    gate.install_snapshot(POOL, snap(clock))
    assert gate.release(POOL, "late").reason == "unknown_id"
    d = gate.reserve(POOL, "late", 5_000)
    assert d.reason == "resolved" and not d.admitted
    assert gate.status(POOL).decision.inflight == 0


def test_overrun_is_flagged_and_nothing_more_is_admitted(gate, clock):
    """Real usage above its reservation past the wall is flagged, and the pool refuses after."""
    gate.install_snapshot(POOL, snap(clock, balance=150_000, buffer=50_000))
    gate.reserve(POOL, "a", 90_000)
    d = gate.settle(POOL, "a", 176_571)
    assert d.overrun and d.headroom < 0
    assert gate.reserve(POOL, "b", 1).reason == "balance_wall"
    assert gate.status(POOL).get("overruns") == 1


def test_stale_snapshot_gives_no_headroom(gate, clock):
    """Past its validity the snapshot admits nothing, and says why."""
    gate.install_snapshot(POOL, snap(clock, minutes=30))
    clock.advance(31 * 60_000)
    assert gate.reserve(POOL, "a", 1).reason == "stale_snapshot"


def test_snapshot_usage_cannot_exceed_recorded_usage(gate, clock):
    """usage_at_sync above what we recorded would inflate the wall: it is capped at lifetime usage."""
    gate.install_snapshot(POOL, snap(clock, balance=100_000, settled=5_000_000))
    assert gate.status(POOL).get("settled") == 0


@pytest.mark.parametrize("args", [
    dict(wanted=-5), dict(wanted=0), dict(wanted=2.5), dict(wanted=10**12),
    dict(wanted=10, least=11), dict(wanted=10, ttl_ms=5),
])
def test_bad_reserve_arguments_are_refused_without_a_write(gate, clock, client, keyspace, args):
    """Negative, fractional, absurd amounts and bad TTLs get an error code and change nothing."""
    gate.install_snapshot(POOL, snap(clock))
    before = client.hgetall(keyspace.pool(POOL).state)
    with pytest.raises(GateError) as exc:
        gate.reserve(POOL, "r", **args)
    assert exc.value.code in ("bad_amount", "bad_ttl")
    assert client.hgetall(keyspace.pool(POOL).state) == before


def test_script_flush_changes_nothing_for_the_caller(gate, clock, client):
    """NOSCRIPT after SCRIPT FLUSH is absorbed by register_script's reload."""
    gate.install_snapshot(POOL, snap(clock))
    gate.reserve(POOL, "a", 100)
    client.script_flush()
    assert gate.settle(POOL, "a", 50).reason == "settled"
    client.script_flush()
    assert gate.reserve(POOL, "b", 100).reason == "admitted"


def test_timeline_gives_usage_as_of_an_earlier_minute(gate, clock):
    """usage_at(t) is the lifetime usage of the last complete minute before t (never more)."""
    gate.install_snapshot(POOL, snap(clock, minutes=120))
    for i in range(3):
        gate.settle(POOL, f"u{i}", 1_000)
        clock.advance(5 * 60_000)
    assert gate.usage_at(POOL, T0 + 1) == 0  # its minute is not complete yet: not counted
    assert gate.usage_at(POOL, T0 + 2 * 60_000) == 1_000
    assert gate.usage_at(POOL, T0 + 7 * 60_000) == 2_000
    assert gate.usage_at(POOL, clock.now_ms()) == 3_000


def test_timeline_marks_usage_counted_without_a_measurement(gate, clock):
    """A reservation kept whole (no usage reported) or expired is counted, and marked unsure in
    the timeline: the lag observer reads only what surely ran (limit.UsageView.first_above)."""
    gate.install_snapshot(POOL, snap(clock, minutes=120))
    gate.reserve(POOL, "kept", 5_000)
    gate.settle(POOL, "kept", None)
    gate.reserve(POOL, "measured", 5_000)
    gate.settle(POOL, "measured", 1_200)
    gate.reserve(POOL, "lost", 3_000, ttl_ms=60_000)
    clock.advance(2 * 60_000)
    gate.status(POOL)  # the sweep counts the lost request's reservation
    entries, floor = gate.timeline_entries(POOL, T0 - 60_000)
    assert floor == 0
    assert [(used, unsure) for _, used, unsure in entries] == [(6_200, 5_000), (9_200, 8_000)]
    assert gate.timeline(POOL, T0 - 60_000)[0] == [(m, used) for m, used, _ in entries]
    assert gate.usage_at(POOL, clock.now_ms() + 60_000) == 9_200  # usage_at parses the entries too


def test_server_time_is_used_when_no_clock_is_injected(client, keyspace):
    """Without an injected clock the scripts read Redis TIME, so deadlines are server-based."""
    gate = Gate(client, keyspace)
    now = int(client.time()[0]) * 1000
    gate.install_snapshot(POOL, Snapshot(1_000_000, 0, 0, 0, 2_000_000, now + 600_000))
    d = gate.reserve(POOL, "a", 100)
    assert d.reason == "admitted"
    with pytest.raises(GateError):
        gate.install_snapshot(POOL, Snapshot(1, 0, 0, 0, 1, now - 1_000))


def test_unreachable_store_raises_store_unavailable(keyspace):
    """A dead Redis is one clear exception, not a redis-py traceback."""
    dead = connect("redis://127.0.0.1:1/0")  # the guard's client (no 10 retries with backoff)
    with pytest.raises(StoreUnavailable, match="unreachable"):
        Gate(dead, keyspace).reserve(POOL, "a", 1)


def test_racing_reservations_grant_exactly_k(client, keyspace, clock):
    """64 threads race for a pool with headroom for exactly k reservations: exactly k win."""
    k, each = 17, 10_000
    gate = Gate(client, keyspace, clock)
    gate.install_snapshot(POOL, Snapshot(k * each, 0, 0, 0, 10**9, clock.now_ms() + 3_600_000, 0))
    barrier = threading.Barrier(64)
    results: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        barrier.wait()
        d = gate.reserve(POOL, f"t{i}", each)
        with lock:
            results.append(d.reason)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("admitted") == k
    assert results.count("balance_wall") == 64 - k
    assert gate.status(POOL).decision.inflight == k * each


def test_snapshot_carries_its_package_list(gate, clock):
    """The package list (with expiries) is written by the same atomic call as the walls."""
    pkgs = [{"instance_no": "P1", "available": 700_000, "expires_ms": T0 + 86_400_000}]
    gate.install_snapshot(POOL, Snapshot(700_000, 0, 0, 0, 2_000_000, T0 + 600_000, 0, pkgs))
    state = gate.status(POOL)
    assert state.packages == pkgs and state.get("snap_at") == T0


def test_eviction_deadlines_come_back_on_this_hosts_clock(client, keyspace):
    """Deadlines stamped on the store's clock are translated by the skew to this host's clock."""
    import asyncio
    import time

    from backend import TEST_REDIS_URL
    from volc_quota_guard.gate import AsyncGate
    from volc_quota_guard.gate.store import connect_async

    skewed = ManualClock(int(time.time() * 1000) - 3_600_000)  # the store is an hour behind us
    Gate(client, keyspace, skewed).install_snapshot(  # collection wall: evicted until midnight
        POOL, Snapshot(10**9, 0, 0, 0, 500, skewed.now_ms() + 600_000, 1_000))

    async def read() -> dict[str, int]:
        return await AsyncGate(connect_async(TEST_REDIS_URL), keyspace, skewed).evicted_until(
            [POOL, "acct-z/never-synced"])

    got = asyncio.run(read())
    assert got["acct-z/never-synced"] == 0
    midnight_here = next_beijing_midnight_ms(skewed.now_ms()) + 3_600_000
    assert abs(got[POOL] - midnight_here) < 5_000


def test_an_unmeasured_first_wave_cannot_pass_the_free_balance_even_at_the_ceiling(gate, clock):
    """Prompts admitted before any settle are bounded so that, were each one corr_max (3.0) times
    its count, the wave's usage stays within the free balance (wall + buffer)."""
    gate.install_snapshot(POOL, snap(clock, balance=400_000, buffer=50_000))
    admitted = []
    for i in range(40):  # 20k-token prompts the tokenizer counts at 9k (45%), 1k output each
        d = gate.reserve(POOL, f"w{i}", 9_000 + 1_000, input_tokens=9_000)
        if d.admitted:
            admitted.append(d)
    assert admitted and len(admitted) < 40
    worst = sum(d.amount - d.input_reserved + 9_000 * 3 for d in admitted)
    assert worst <= 400_000  # were each prompt 27k, the true free balance still covers the wave
    # without the bound, the floor (1.7) alone admits ~22 of them: 22 x 28k = 616k worst case
    assert len(admitted) * (9_000 * 17 // 10 + 1_000) < 350_000


def test_the_ceiling_bound_also_holds_the_daily_cap(gate, clock):
    """On the collection side (no buffer) the same wave stays inside the day's cap at 3.0x."""
    gate.install_snapshot(POOL, snap(clock, balance=10_000_000, cap=300_000, minutes=24 * 60))
    admitted = [d for i in range(40)
                if (d := gate.reserve(POOL, f"c{i}", 10_000, input_tokens=9_000)).admitted]
    assert admitted
    assert sum(d.amount - d.input_reserved + 9_000 * 3 for d in admitted) <= 300_000
    assert gate.reserve(POOL, "c-last", 10_000, input_tokens=9_000).reason == "collection_wall"


def test_an_exact_count_is_reserved_at_its_own_floor_and_learns_its_own_correction(gate, clock):
    """An exact reservation holds its count × kx (floor 1.1), not the pool's k (1.7); a settle
    whose measured prompt is above the exact count raises kx only, and a cheap settle k only."""
    gate.install_snapshot(POOL, snap(clock))
    d = gate.reserve(POOL, "x1", 1_000 + 500, input_tokens=1_000, exact=True)
    assert d.admitted and d.input_reserved == 1_100 and d.amount == 1_600
    cheap = gate.reserve(POOL, "c1", 1_000 + 500, input_tokens=1_000)
    assert cheap.input_reserved == 1_700
    st = gate.status(POOL)
    assert (st.get("inflight_xest"), st.get("inflight_xest_res")) == (1_000, 1_100)
    assert (st.get("inflight_est"), st.get("inflight_est_res")) == (1_000, 1_700)
    gate.settle(POOL, "x1", 1_300 + 500, measured_input=1_300)  # Ark's template: 30% over the count
    st = gate.status(POOL)
    assert (st.get("xcorr"), st.get("xcorr_n"), st.get("corr"), st.get("corr_n")) == (1_300_000, 1, 0, 0)
    assert (st.get("inflight_xest"), st.get("inflight_xest_res")) == (0, 0)
    assert gate.reserve(POOL, "x2", 1_500, input_tokens=1_000, exact=True).input_reserved == 1_300
    assert gate.reserve(POOL, "c2", 1_500, input_tokens=1_000).input_reserved == 1_700  # k unmoved
    gate.settle(POOL, "c1", 1_000, measured_input=900)
    assert gate.status(POOL).get("xcorr") == 1_300_000
    # kx learns past the exact miscount ceiling (1.5), up to corr_max: a template Ark changed.
    gate.settle(POOL, "x2", 2_400 + 500, measured_input=2_400)
    d = gate.reserve(POOL, "x3", 1_500, input_tokens=1_000, exact=True)
    assert (d.input_reserved, d.exact_correction_ppm, d.correction_ppm) == (2_400, 2_400_000, 1_700_000)


def test_exact_counts_are_held_to_a_ceiling_of_1_5_not_3(gate, clock):
    """Near the wall the miscount risk holds exact prompts at 1.5x their count, cheap ones at 3x:
    a wave of exact reservations gets about twice as many requests in flight, and even at
    1.5x each the wave stays inside the free balance (wall + buffer)."""
    gate.install_snapshot(POOL, snap(clock, balance=400_000, buffer=50_000))
    exact = [d for i in range(80)
             if (d := gate.reserve(POOL, f"x{i}", 10_000, input_tokens=9_000, exact=True)).admitted]
    assert sum(d.amount - d.input_reserved + 9_000 * 3 // 2 for d in exact) <= 400_000
    gate.install_snapshot(POOL_B, snap(clock, balance=400_000, buffer=50_000))
    cheap = [d for i in range(80)
             if (d := gate.reserve(POOL_B, f"c{i}", 10_000, input_tokens=9_000)).admitted]
    assert (len(exact), len(cheap)) == (27, 14)  # 400k / (9k x 1.5 + 1k), 400k / (9k x 3 + 1k)


def test_a_reservation_record_without_a_class_still_settles_as_cheap(gate, clock, client, keyspace):
    """Records written before the exact class (amount:deadline:est:est_res) parse as cheap."""
    gate.install_snapshot(POOL, snap(clock))
    d = gate.reserve(POOL, "old", 2_000, input_tokens=1_000, exact=True)
    keys = keyspace.pool(POOL)
    client.hset(keys.reservations, "old", f"{d.amount}:{clock.now_ms() + 60_000}:1000:1700")
    client.hset(keys.state, mapping={"inflight_xest": 0, "inflight_xest_res": 0,
                                     "inflight_est": 1_000, "inflight_est_res": 1_700})
    gate.settle(POOL, "old", 1_500, measured_input=1_400)
    st = gate.status(POOL)
    assert (st.get("corr"), st.get("xcorr"), st.get("inflight"), st.get("inflight_est")) == \
        (1_400_000, 0, 0, 0)


def test_a_bad_counting_class_is_refused_without_a_write(gate, clock, client, keyspace):
    """The class argument is '' or 'exact': anything else is an error code and no write."""
    gate.install_snapshot(POOL, snap(clock))
    before = client.hgetall(keyspace.pool(POOL).state)
    raw = gate._scripts["reserve"](keys=keyspace.pool(POOL).gate_keys("reserve"),
                 args=[str(clock.now_ms()), "r", "10", "10", "60000", "5", "fuzzy"])
    assert [v.decode() if isinstance(v, bytes) else v for v in raw[:2]] == ["error", "bad_class"]
    assert client.hgetall(keyspace.pool(POOL).state) == before


def test_a_process_keeps_its_latest_answer_per_generation(gate, client, keyspace, clock):
    """Every answer carries the state's generation, today's and lifetime usage with in-flight
    prompts at the miscount ceiling; the process keeps the latest per generation (the last two),
    so a wipe cannot take what it admitted after its last poll."""
    first = gate.install_snapshot(POOL, snap(clock)).generation
    assert first == T0
    d = gate.reserve(POOL, "a", 7_000, input_tokens=1_000)  # the input held at k = 1.7
    seen = gate.sighting(POOL, first)
    assert seen == d and d.generation == first
    # In flight at the ceiling: 1,000 × 3.0 where 1,700 was held.
    assert d.today_worst == d.lifetime_worst == d.inflight + 3_000 - 1_700
    gate.settle(POOL, "a", 2_500, measured_input=1_000)
    assert gate.sighting(POOL, first).today_worst == 2_500  # the latest answer wins

    def wipe_and_start_over(at: int) -> int:
        for key in client.scan_iter(f"{keyspace.prefix}:*"):
            client.delete(key)
        clock.set(at)
        return gate.install_snapshot(POOL, snap(clock)).generation

    second = wipe_and_start_over(T0 + 60_000)
    assert gate.sighting(POOL, first).today_worst == 2_500  # the lost generation's stays
    third = wipe_and_start_over(T0 + 120_000)
    assert gate.sighting(POOL, first) is None
    assert gate.sighting(POOL, second) is not None and gate.sighting(POOL, third) is not None


def test_a_snapshot_from_an_older_listing_is_refused(gate, clock):
    """A sync whose listing stalled past its lock must not install a balance a later sync saw
    spent (red-team stop 37: the older listing reopened a pool at 0 and billed 100,000)."""
    listed = clock.now_ms()
    gate.install_snapshot(POOL, replace(snap(clock, balance=0), listed_at_ms=listed))
    with pytest.raises(GateError) as exc:
        gate.install_snapshot(POOL, replace(snap(clock, balance=200_000), listed_at_ms=listed - 90_000))
    assert exc.value.code == "older_listing"
    assert gate.reserve(POOL, "r1", 100).reason == "balance_wall"  # the later one still stands
    gate.install_snapshot(POOL, replace(snap(clock, balance=200_000), listed_at_ms=listed))  # same: fine
    gate.install_snapshot(POOL, snap(clock, balance=300_000))  # by hand (no listing): always
    assert gate.reserve(POOL, "r2", 100).reason == "admitted"


def test_a_listing_time_from_a_clock_since_set_back_orders_nothing(gate, clock):
    """A sync on a clock 10 minutes fast stamped its listing in the future; once the clock is
    fixed, newer listings must still install (red-team, stop 37: they were refused until real
    time passed the stamp, while the package ran dry)."""
    gate.install_snapshot(POOL, replace(snap(clock, balance=200_000), listed_at_ms=clock.now_ms() + 600_000))
    clock.advance(60_000)
    gate.install_snapshot(POOL, replace(snap(clock, balance=0), listed_at_ms=clock.now_ms()))
    assert gate.reserve(POOL, "r1", 100).reason == "balance_wall"
    with pytest.raises(GateError) as exc:  # and from then on the order holds again
        gate.install_snapshot(POOL, replace(snap(clock, balance=200_000), listed_at_ms=clock.now_ms() - 1))
    assert exc.value.code == "older_listing"


def test_the_limit_state_of_an_older_listing_does_not_overwrite_a_later_one(gate, clock):
    """A sync that installed first but writes its estimator state last must not put its older
    view back (red-team, stop 37: billing_since and the package view went back); a stored stamp
    from the future (a clock since set back) orders nothing."""
    now = clock.now_ms()
    assert gate.records.write_limit_state(POOL, {"billing_since_ms": 7}, listed_at_ms=now, now_ms=now)
    assert not gate.records.write_limit_state(POOL, {"billing_since_ms": 0}, listed_at_ms=now - 90_000,
                                              now_ms=now)
    assert gate.records.limit_state(POOL)["billing_since_ms"] == 7
    assert gate.records.write_limit_state(POOL, {"billing_since_ms": 0}, listed_at_ms=now - 90_000,
                                          now_ms=now - 120_000)  # the stored stamp is ahead of now
    assert gate.records.limit_state(POOL)["billing_since_ms"] == 0
