"""LiteLLM's health checks (`GET /health`, `background_health_checks`) call each deployment with
its `litellm_params` and no `model_info`: they are reserved and settled in the deployment's own
pool (red-team pass, stop 34: they were reserved in the `default` account's pool while Ark billed
the deployment's account — 482 tokens billed on a pool at its wall — and never settled)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from proxy_support import MASTER_KEY, Proxy, ark_deployment, start_syncing_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy
WALL = ("acct-c/hc-wall-260101", 300)  # less than a health check needs beyond SMALL_BUFFER
ROOM = ("acct-c/hc-room-260101", 60_000)


@pytest.fixture(scope="module")
def px(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
       prefix: str) -> Iterator[Proxy]:
    p = start_syncing_proxy(tmp_path_factory.mktemp("hc"), fake, store_url, prefix, dict([WALL, ROOM]),
                            [ark_deployment("hc-wall", WALL[0]), ark_deployment("hc-room", ROOM[0])],
                            VQG_SMALL_BUFFER="100", VQG_EVICT_BELOW="50")
    yield p
    stop_proxy(p)


def health(px: Proxy, model: str) -> dict:
    r = httpx.get(f"{px.url}/health", params={"model": model}, timeout=60,
                  headers={"Authorization": f"Bearer {MASTER_KEY}"})
    assert r.status_code in (200, 503), r.text[:300]  # 503: no healthy endpoint
    return r.json()


def test_a_health_check_of_a_pool_at_its_wall_is_refused_and_bills_nothing(px: Proxy) -> None:
    # The pool the guard used to pick: the same model on the default account, with room.
    px.seed("default/hc-wall-260101", 1_000_000)
    for _ in range(10):
        assert health(px, "hc-wall")["unhealthy_count"] == 1
    px.wait_for_log(r"PRE-BLOCK.*pool=acct-c/hc-wall-260101", count=10)
    assert px.fake.pool_totals(WALL[0]).consumed == 0
    assert px.state("default/hc-wall-260101").get("ucum") == 0


def test_a_health_check_is_reserved_and_settled_in_its_own_pool(px: Proxy) -> None:
    before = px.state(ROOM[0]).get("ucum")
    for i in range(3):
        assert health(px, "hc-room")["healthy_count"] == 1
        px.wait_for_log(r"\[Usage\] hc-room-260101:.*source=measured", count=i + 1)
    st = px.state(ROOM[0])
    consumed = px.fake.pool_totals(ROOM[0]).consumed
    assert consumed > 0 and st.get("ucum") - before >= consumed
    assert st.get("inflight") == 0, st.fields
