"""The guard on a 3-master Redis Cluster (VQG_REDIS_CLUSTER=true): every verb, the sync and two
proxy instances, with pools spread over the masters."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from proxy_support import (
    ACCOUNTS,
    MASTER_KEY,
    POOL_A,
    POOL_SOLO,
    Proxy,
    call_id,
    start_proxy,
    stop_proxy,
    sync_env,
)
from redis.crc import key_slot
from redis_servers import RedisCluster, cluster_port, redis_cluster

from volc_quota_guard.clock import ManualClock, next_beijing_midnight_ms
from volc_quota_guard.config import load_settings
from volc_quota_guard.errors import StoreUnavailable
from volc_quota_guard.fake import FakeVolcengine
from volc_quota_guard.gate import AsyncGate, Gate, Snapshot
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.store import connect, connect_async, is_cluster
from volc_quota_guard.proxy import runtime
from volc_quota_guard.sync import SyncService
from volc_quota_guard.volcengine.billing import BillingClient
from volc_quota_guard.volcengine.packages import PoolSpec

T0 = 1_786_600_000_000  # 2026-08-13 13:46 Beijing


def _spread_pools(per_third: int = 2) -> list[str]:
    """Pools whose hash tags fall in each third of the slot range (one master each)."""
    found: dict[int, list[str]] = {0: [], 1: [], 2: []}
    for i in range(1_000):
        pool = f"acct-{i}/deepseek-v4-flash-ga-260731"
        third = min(key_slot(f"{{{pool}}}".encode()) * 3 // 16_384, 2)
        if len(found[third]) < per_third:
            found[third].append(pool)
    return [p for pools in found.values() for p in pools]


POOLS = _spread_pools()
CLUSTER_ERRORS = re.compile(r"CROSSSLOT|MOVED|ClusterDown|RedisClusterException|STORE-DOWN|store error")


def spread(cluster: RedisCluster, keyspace: KeySpace) -> dict[int, list[str]]:
    by_node: dict[int, list[str]] = {}
    for pool in POOLS:
        by_node.setdefault(cluster.node_of(keyspace.pool(pool).state), []).append(pool)
    return by_node


@pytest.fixture
def keyspace() -> KeySpace:
    """A fresh prefix on the module's cluster (the cluster is thrown away afterwards)."""
    return KeySpace(f"vqgtest-{uuid.uuid4().hex[:10]}")


def test_gate_verbs_run_on_every_master_and_survive_a_script_flush(cluster: RedisCluster,
                                                                   keyspace: KeySpace) -> None:
    """Reserve, settle, release, status, timeline and the pool index work for pools on all three
    masters through the cluster client; a SCRIPT FLUSH on every node is reloaded transparently."""
    by_node = spread(cluster, keyspace)
    assert len(by_node) == 3, by_node  # the test really spans the cluster
    client = connect(cluster.url, cluster=True)
    assert is_cluster(client)
    clock = ManualClock(T0)
    gate = Gate(client, keyspace, clock)
    for i, pool in enumerate(POOLS):
        gate.install_snapshot(pool, Snapshot(100_000, 0, 0, 0, 2_000_000, T0 + 3_600_000, 1_000))
        assert gate.reserve(pool, "a", 30_000).reason == "admitted"
        assert gate.reserve(pool, "b", 80_000, least=1_000).amount == 70_000  # clamped
        if i == 3:
            cluster.flush_scripts()  # as after a failover: NOSCRIPT on the pool's node, reloaded
        clock.advance(60_000)
        assert gate.settle(pool, "a", 20_000).reason == "settled"
        assert gate.release(pool, "b").amount == 70_000
        state = gate.status(pool)
        assert (state.get("ucum"), state.get("inflight")) == (20_000, 0)
        clock.advance(60_000)
        assert gate.usage_at(pool, clock.now_ms()) == 20_000
        minutes, floor = gate.timeline(pool, T0)
        assert [u for _, u in minutes] == [20_000] and floor == 0
    assert gate.pools() == sorted(POOLS)
    assert gate.now_ms() == clock.now_ms()
    assert Gate(client, keyspace).now_ms() > 0  # the cluster's TIME, from one master


def test_the_clock_check_reads_every_master(cluster: RedisCluster, keyspace: KeySpace,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pool's scripts read the clock of its own master: one master 600 s fast is caught
    whichever master a key-less TIME would have reached (it read one only: stop 37)."""
    client = connect(cluster.url, cluster=True)
    gate = Gate(client, keyspace)
    primaries = client.get_primaries()
    assert len(primaries) == 3
    real = client.time
    off = primaries[2].name

    def time_of(target_nodes: object = None, **kw: object) -> object:
        sec, usec = real(target_nodes=target_nodes, **kw)
        return (sec + 600, usec) if getattr(target_nodes, "name", None) == off else (sec, usec)

    monkeypatch.setattr(client, "time", time_of)
    skew, slack = gate.clock_skew_ms()
    assert 599_000 < skew - slack and skew < 601_000
    cfg = load_settings(max_clock_skew_seconds=2)
    svc = SyncService(cfg, gate, lambda: [], lambda account: None)  # type: ignore[arg-type, return-value]
    svc.check_clock()
    assert svc.alarm.reason is not None and "+600" in svc.alarm.reason
    monkeypatch.setattr(client, "time", real)
    svc.check_clock()
    assert svc.alarm.reason is None


def test_a_plain_client_on_a_cluster_fails_closed_and_says_what_to_set(cluster: RedisCluster,
                                                                        keyspace: KeySpace) -> None:
    """Without VQG_REDIS_CLUSTER a pool on another master is a clear store error (fail closed)
    naming the setting, never a wrong answer."""
    elsewhere = [p for p in POOLS if cluster.node_of(keyspace.pool(p).state) != cluster.ports[0]]
    with pytest.raises(StoreUnavailable, match="set VQG_REDIS_CLUSTER=true"):
        Gate(connect(cluster.url), keyspace).reserve(elsewhere[0], "r", 1)


def test_async_gate_and_eviction_reads_span_the_masters(cluster: RedisCluster,
                                                        keyspace: KeySpace) -> None:
    """The hook's client reserves on a cluster, and one eviction read covers pools on every
    master (TIME asked separately: a cluster pipeline cannot carry it), on this host's clock."""
    seed = Gate(connect(cluster.url, cluster=True), keyspace)
    now = seed.now_ms()
    evicted = POOLS[::2]  # collection wall already reached: out of routing until midnight
    for pool in POOLS:
        cap = 50 if pool in evicted else 2_000_000
        seed.install_snapshot(pool, Snapshot(10**9, 0, 0, 0, cap, now + 600_000, 1_000))

    async def run() -> dict[str, int]:
        gate = AsyncGate(connect_async(cluster.url, cluster=True), keyspace)
        for pool in POOLS:
            d = await gate.reserve(pool, "r", 100)
            assert d.admitted == (pool not in evicted), (pool, d)
            if d.admitted:
                assert (await gate.settle(pool, "r", 80)).reason == "settled"
        got = await gate.evicted_until([*POOLS, "acct-z/never-synced"])
        await gate.client.aclose()
        return got

    got = asyncio.run(run())
    here_now = int(time.time() * 1000)
    for pool in POOLS:
        if pool in evicted:
            assert abs(got[pool] - next_beijing_midnight_ms(here_now)) < 5_000, pool
        else:
            assert got[pool] == 0, pool
    assert got["acct-z/never-synced"] == 0


def test_sync_elects_one_caller_and_installs_snapshots_on_the_cluster(cluster: RedisCluster,
                                                                      keyspace: KeySpace) -> None:
    """Two sync services on the cluster: the lock and meta keys (outside any pool's slot) elect
    one billing call per interval, and each pool gets its snapshot on its own master."""
    clock = ManualClock(T0)
    env = {"VOLC_ACCESSKEY_ACCT_A": "AK-a", "VOLC_SECRETKEY_ACCT_A": "SK-a"}
    with FakeVolcengine({"acct-a": ACCOUNTS["acct-a"]}, clock=clock) as fake:
        pools = ["acct-a/deepseek-v4-flash-ga-260731", "acct-a/doubao-seed-2-1-pro-260628"]
        for pool, amount in zip(pools, (300_000, 700_000), strict=True):
            fake.add_package(pool, amount, acquired_ms=T0 - 86_400_000)
        cfg = load_settings(billing_endpoint=fake.url,  # an idle account: no cold-start hold
                            cold_start_admit_tokens=10**9, unseen_day_tokens=0)

        def service() -> SyncService:
            def lister(account: str) -> BillingClient:
                return BillingClient.for_account(account, config=cfg, env=env, wait_initial=0.01,
                                                 wait_max=0.02, wait_jitter=0.0, attempts=2,
                                                 page_interval=0)
            gate = Gate(connect(cluster.url, cluster=True), keyspace, clock)
            return SyncService(cfg, gate, lambda: [PoolSpec(p) for p in pools], lister)

        first, second = service(), service()
        ran = [o.ran for o in first.tick() + second.tick()]
        assert ran == [True, False] and fake.api_calls("acct-a") == 1
        gate = first.gate
        for pool, amount in zip(pools, (300_000, 700_000), strict=True):
            d = gate.status(pool).decision
            assert d.balance_wall == amount - cfg.small_buffer, pool
        assert gate.reserve(pools[0], "big", 295_000).reason == "balance_wall"
        assert gate.reserve(pools[1], "big", 295_000).reason == "admitted"


def test_a_proxy_starts_with_the_cluster_down_and_syncs_once_it_is_up(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A cluster client needs the cluster to be built: with it down the proxy's startup does not
    fail (one clear error, no password in it), and the sync thread starts once the cluster is up."""
    ports = [cluster_port() for _ in range(3)]
    url = f"redis://vqg:s3cret@127.0.0.1:{ports[0]}/0"
    with pytest.raises(StoreUnavailable) as down:
        connect(url, cluster=True)
    assert "s3cret" not in str(down.value) and "Cluster unreachable" in str(down.value)

    monkeypatch.setattr(runtime, "PROCESS", runtime.Process())
    monkeypatch.setattr(runtime, "router_pools", list)  # no proxy router here: no pools
    cfg = load_settings(VQG_REDIS_URL=f"redis://127.0.0.1:{ports[0]}/0", redis_cluster=True,
                        sync_poll_seconds=0.05)
    with caplog.at_level(logging.ERROR, logger="volc_quota_guard.sync"):
        assert runtime.start(cfg) is None
    assert "sync thread not started yet" in caplog.text
    with redis_cluster(ports):
        deadline = time.monotonic() + 15
        while runtime.PROCESS.service is None and time.monotonic() < deadline:
            time.sleep(0.1)
        service = runtime.PROCESS.service
        assert service is not None and is_cluster(service.gate.client)
        service.stop(2)


# ---- two proxy instances -------------------------------------------------------------------

def synced(proxies: list[Proxy], pattern: str, timeout: float = 30) -> None:
    """Wait for a sync line in any proxy's log (the lock elects one of them to call the API)."""
    deadline = time.monotonic() + timeout
    while not any(re.search(pattern, p.log()) for p in proxies):
        assert time.monotonic() < deadline, f"no /{pattern}/ in any proxy log"
        time.sleep(0.1)


def ask(proxy: Proxy, model: str, text: str, max_tokens: int) -> httpx.Response:
    return httpx.post(f"{proxy.url}/v1/chat/completions", timeout=60,
                      headers={"authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": call_id()},
                      json={"model": model, "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": text}]})


@pytest.fixture(scope="module")
def proxies(cluster: RedisCluster, fake: FakeVolcengine,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Proxy]]:
    """Two proxies on the cluster, both running the billing sync against the fake; reservations
    expire after 10 s (the lowest allowed TTL)."""
    fake.add_package(POOL_SOLO, 30_000)
    fake.add_package(POOL_A, 100_000)
    env = sync_env(fake, VQG_REDIS_CLUSTER="true", VQG_RESERVATION_TTL_SECONDS="10",
                   VQG_EVICT_BELOW="500")
    prefix = f"vqgtest-cl-{uuid.uuid4().hex[:8]}"
    homes = [tmp_path_factory.mktemp(f"cluster{i}") for i in range(2)]  # not in the threads: see
    with ThreadPoolExecutor(2) as pool:  # tests/proxy/test_proxy_store_down.py
        started = list(pool.map(lambda home: start_proxy(home, fake, cluster.url, prefix, env=env),
                                homes))
    for p in started:
        p.gate = Gate(connect(cluster.url, cluster=True), KeySpace(prefix))
    yield started
    for p in started:
        stop_proxy(p)


@pytest.mark.proxy
def test_two_proxies_on_a_cluster_never_overrun_the_wall(proxies: list[Proxy]) -> None:
    """48 concurrent requests split over two proxies on the cluster near a synced wall: what the
    upstream consumed stays under it, nothing is billed, and no proxy logs a cluster error."""
    first, second = proxies
    synced(proxies, rf"\[Sync\] {POOL_SOLO}: Bal=30,000")
    fake = first.fake

    def one(i: int, max_tokens: int = 1_000) -> int:
        return ask(proxies[i % 2], "solo", f"r{i} [[fake completion=1000]]", max_tokens).status_code

    assert [one(0, 10), one(1, 10)] == [200, 200]  # both warm, so both race for the headroom
    with ThreadPoolExecutor(48) as pool:
        codes = list(pool.map(one, range(48)))
    assert set(codes) <= {200, 429}, codes
    served_by = [codes[i::2].count(200) for i in range(2)]
    assert all(n >= 1 for n in served_by), served_by
    assert codes.count(429) >= 10, codes  # the wall was really reached
    totals = fake.pool_totals(POOL_SOLO)
    assert totals.billed == 0 and totals.consumed <= 25_000, totals
    deadline = time.monotonic() + 20
    while (d := first.state(POOL_SOLO).decision).inflight and time.monotonic() < deadline:
        time.sleep(0.1)
    assert d.inflight == 0 and d.used_balance <= d.balance_wall and d.used_balance >= totals.consumed
    assert first.state(POOL_SOLO).get("overruns") == 0
    for p in proxies:
        assert not CLUSTER_ERRORS.search(p.log()), p.log()[-3000:]


@pytest.mark.proxy
def test_a_proxy_killed_mid_request_leaves_a_reservation_that_expires_as_consumed(
        proxies: list[Proxy]) -> None:
    """SIGKILL one proxy while its upstream call runs: its reservation outlives it, then expires at
    its deadline and is counted as consumed (never less than the upstream used); the other proxy
    keeps serving the pool."""
    first, second = proxies
    synced(proxies, rf"\[Sync\] {POOL_A}: Bal=100,000")
    before = first.state(POOL_A).fields
    slow = ThreadPoolExecutor(1)
    pending = slow.submit(ask, second, "deepseek-v4-flash@acct-a",
                          "slow [[fake completion=500 delay=4]]", 1_000)
    deadline = time.monotonic() + 20
    while not (held := first.state(POOL_A).get("inflight")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held > 500, "the request never reserved"
    second.process.kill()  # no callback will ever settle it
    second.process.wait(timeout=10)
    with pytest.raises(httpx.HTTPError):
        pending.result(timeout=30)
    slow.shutdown()
    assert first.state(POOL_A).get("inflight") == held  # still held: it may have run
    assert ask(first, "deepseek-v4-flash@acct-a", "meanwhile", 10).status_code == 200
    deadline = time.monotonic() + 30
    while (st := first.state(POOL_A)).get("expired_count") == before.get("expired_count", 0) \
            and time.monotonic() < deadline:
        time.sleep(0.2)  # `status` sweeps reservations past their deadline (10 s TTL)
    assert st.get("expired_count") == before.get("expired_count", 0) + 1
    assert st.get("inflight") == 0
    upstream = [r for r in first.fake.chat_requests() if r.pool == POOL_A]
    counted = st.get("ucum") - before.get("ucum", 0)
    assert counted >= held  # the held amount, plus the small request served meanwhile
    assert sum(r.consumed for r in upstream) <= counted
    assert first.fake.pool_totals(POOL_A).billed == 0
