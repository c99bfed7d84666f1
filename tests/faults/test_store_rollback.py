"""The store comes back from an older copy of itself (an RDB dump, a replica promoted
with async replication lag). The state's generation is unchanged, so nothing marked it lost, but
the usage settled after the copy is gone."""

from __future__ import annotations

import logging

import pytest
from fault_support import ACCOUNT, CREDENTIALS, POOL, BillingWorld, beijing_ms
from redis_servers import RedisServer

from volc_quota_guard.clock import ManualClock
from volc_quota_guard.config import load_settings
from volc_quota_guard.fake import FakeVolcengine, Ledger
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.store import connect


def test_redis_restored_from_an_older_dump_bills_nothing(scratch_redis: RedisServer,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(beijing_ms("2026-08-14 09:00"))
    with FakeVolcengine({ACCOUNT: tuple(CREDENTIALS.values())}, ledger=Ledger(lag_minutes=14),
                        clock=clock) as fake:
        fake.add_package(POOL, 400_000, acquired_ms=beijing_ms("2026-08-13 10:30"))
        cfg = load_settings(billing_endpoint=fake.url, unseen_day_tokens=0)
        w = BillingWorld(clock, fake, cfg, connect(scratch_redis.url), KeySpace("vqgtest-rollback"))
        assert set(w.minutes(21, 0)) == {"idle"}  # the first start's hold
        assert set(w.minutes(30, 2_000)) == {"admitted"}  # 60,000
        w.client.save()  # the store's last RDB dump (redis.conf `save ...`; here by hand)
        assert set(w.minutes(8, 20_000)) == {"admitted"}  # 160,000 after the dump
        scratch_redis.kill()  # a crash: no shutdown save
        scratch_redis.start()  # back from the dump: same generation, 160,000 of usage gone
        with caplog.at_level(logging.WARNING, logger="volc_quota_guard"):
            # A burst right after the restore, inside the API's lag: served at once (one
            # process: its checkpoint holds all it admitted, no hold) up to the wall.
            burst = w.minutes(12, 30_000)
            assert fake.pool_totals(POOL).billed == 0  # on HEAD: 60,000 billed
            assert "the store went back in time" in caplog.text
            w.minutes(60, 5_000)
        assert "admitted" in burst[:2] and burst[-1] == "balance_wall", burst  # after the window
        totals = fake.pool_totals(POOL)
        assert totals.billed == 0 and totals.burned == 0, totals
