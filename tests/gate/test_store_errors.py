"""The one Redis error mapping: whatever redis-py raises, the gate and its side records raise
`StoreUnavailable` (chained from the original), for the sync and the asyncio clients alike."""

from __future__ import annotations

import asyncio
import re
from importlib import resources

import pytest
import redis
from redis.exceptions import MovedError

from volc_quota_guard.errors import StoreUnavailable
from volc_quota_guard.gate import Gate, KeySpace, values
from volc_quota_guard.gate.store import amapped, connect, store_errors

FAILURES = [
    redis.ConnectionError("Error 111 connecting"),
    redis.TimeoutError("Timeout reading from socket"),
    redis.ResponseError("OOM command not allowed"),
    redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica."),
    MovedError("3999 127.0.0.1:6381"),
    OSError("network is unreachable"),
]


@pytest.mark.parametrize("failure", FAILURES, ids=lambda e: type(e).__name__)
def test_every_redis_failure_becomes_store_unavailable(failure):
    """Inside `store_errors()` each redis-py failure arrives as StoreUnavailable `from` it."""
    with pytest.raises(StoreUnavailable) as err, store_errors():
        raise failure
    assert err.value.__cause__ is failure


def test_a_moved_answer_says_to_set_the_cluster_flag():
    """A plain client on a cluster node is told what to set."""
    with pytest.raises(StoreUnavailable, match="VQG_REDIS_CLUSTER=true"), store_errors():
        raise MovedError("3999 127.0.0.1:6381")


def test_the_async_path_maps_the_same():
    """An awaited command failing maps like a sync one."""
    async def fail() -> None:
        raise redis.ConnectionError("gone")

    with pytest.raises(StoreUnavailable, match="store unreachable"):
        asyncio.run(amapped(fail))


def test_side_records_of_an_unreachable_store_raise_store_unavailable():
    """Every side record the sync and the consume task use fails as StoreUnavailable."""
    # Nothing listens on port 1; the guard's own client (a plain redis.Redis retries 10 times
    # with backoff: 4 s a call).
    client = connect("redis://127.0.0.1:1/0")
    records = Gate(client, KeySpace("vqgtest-down")).records
    calls = [
        lambda: records.sync_meta("acct"),
        lambda: records.take_sync_lock("acct", "me", 1_000),
        lambda: records.limit_state("acct/m"),
        lambda: records.claim_day("acct/m", 1, {"status": "running"}, 1_000),
        lambda: records.add_history("acct/m", "1:task", 5),
        lambda: records.state_int("acct/m", "ucum"),
    ]
    for call in calls:
        with pytest.raises(StoreUnavailable):
            call()


def test_the_lua_bounds_are_the_python_ones():
    """MAX_REQUEST, MAX_AMOUNT and MAX_TIME in _common.lua equal gate/values.py's."""
    lua = resources.files("volc_quota_guard.resources.lua").joinpath("_common.lua").read_text()
    found = {m[1]: int(m[2]) for m in re.finditer(r"local (MAX_\w+) = (\d+)", lua)}
    assert found["MAX_REQUEST"] == values.MAX_REQUEST
    assert found["MAX_AMOUNT"] == values.MAX_AMOUNT
    assert found["MAX_TIME"] == values.MAX_TIME


def test_a_sync_lock_whose_answer_was_lost_is_still_held_by_its_taker(client, keyspace) -> None:
    """`SET NX` ran but its answer was lost and the retry found the key: that is this owner's
    lock, not another's (a red-team pass: no process synced for a minute)."""
    from volc_quota_guard.gate.records import Records

    records = Records(client, keyspace)
    assert records.take_sync_lock("acct-a", "me", 60_000)
    assert records.take_sync_lock("acct-a", "me", 60_000)  # the retried SET finds its own lock
    assert not records.take_sync_lock("acct-a", "other", 60_000)


def test_a_timeout_is_not_retried_a_dropped_connection_is() -> None:
    """redis-py's Retry retries timeouts by default: a slow Redis cost two socket timeouts per
    call (10 s before a 503) and ran a reserve twice. Only a dropped connection is retried."""
    import redis as redis_mod

    from volc_quota_guard.gate.store import connect, connect_async

    for client in (connect("redis://127.0.0.1:1/0"), connect_async("redis://127.0.0.1:1/0")):
        supported = client.get_retry()._supported_errors  # type: ignore[union-attr]
        assert redis_mod.ConnectionError in supported
        assert redis_mod.TimeoutError not in supported
