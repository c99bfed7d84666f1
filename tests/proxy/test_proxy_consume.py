"""The consume task inside a real LiteLLM proxy: scheduled by its sync thread, calling the fake Ark."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from proxy_support import POOL_A, POOL_B, Proxy, start_proxy, stop_proxy, sync_env

from volc_quota_guard.clock import to_beijing
from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy
HOUR = 3_600_000


@pytest.fixture(scope="module")
def consuming(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
              prefix: str) -> Iterator[Proxy]:
    """A proxy with the sync thread and the consume task on, due from this very minute."""
    fake.set_chat_defaults(completion_tokens=10**9)  # the model writes until max_tokens
    now = fake.now_ms()
    # Expires before the next run, and after the wall's expiry window (a snapshot's life and the
    # longest call: 90 min + 6,000 s + a TTL), which no run can spend.
    fake.add_package(POOL_A, 300_000, expires_ms=now + 4 * HOUR)
    fake.add_package(POOL_B, 300_000)  # 30 days to go: nothing to save tonight
    env = sync_env(fake, VQG_CONSUME_ENABLED="true", VQG_CONSUME_AT=f"{to_beijing(now):%H:%M}")
    p = start_proxy(tmp_path_factory.mktemp("consume"), fake, store_url, prefix, env=env)
    yield p
    stop_proxy(p)


def test_scheduled_run_spends_the_expiring_package_and_nothing_else(consuming: Proxy) -> None:
    """The proxy's own schedule spends pool A's expiring 300k up to its walls, leaves pool B alone,
    bills nothing, and counts every token in the gate."""
    (line,) = consuming.wait_for_log(rf"🍽️ \[CONSUME\] {POOL_A} done consumed=", timeout=60)
    consuming.wait_for_log(rf"🍽️ \[CONSUME\] {POOL_B} done consumed=0 planned=0", timeout=30)
    a, b = consuming.fake.pool_totals(POOL_A), consuming.fake.pool_totals(POOL_B)
    assert 280_000 <= a.consumed <= 300_000 - 2 * 5_000 and a.billed == 0
    assert b.consumed == 0
    assert f"consumed={a.consumed:,}" in line
    state = consuming.state(POOL_A)
    assert state.get("day_usage") == a.consumed and state.get("inflight") == 0
    assert "🍽️ [CONSUME] scheduled daily at" in consuming.log()
