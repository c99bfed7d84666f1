"""Retries of one request on the same deployment, through a real proxy (found by a red-team pass).

LiteLLM can fail an attempt after Ark has answered, and billed: with `enable_json_schema_validation`
a plain-text answer fails the schema check, and the router retries. Each attempt must hold a
reservation of its own; the earlier one is kept whole as consumed (its usage is never reported).
Before, every retry rode the first attempt's reservation (a shortcut meant for the two halves of
a /v1/messages call): three calls to Ark consumed 33,207 while the pool held about two
reservations, and a pool 26,000 tokens from its wall billed 6,207 (29,414 with `num_retries: 5`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from proxy_support import MASTER_KEY, Proxy, ark_deployment, call_id, start_syncing_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy
BUFFER = 1_000
POOLS = {"rt-big": ("acct-c/kimi-retry-big-260101", 50_000_000),
         "rt-wall": ("acct-c/kimi-retry-wall-260101", BUFFER + 26_000),
         "rt-wall5": ("acct-c/kimi-retry-wall5-260101", BUFFER + 36_000),
         "rt-msg": ("acct-c/kimi-retry-msg-260101", 50_000_000)}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}
RESERVED = re.compile(r"reserved=(\d+)")


@pytest.fixture(scope="module")
def px(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
       prefix: str) -> Iterator[Proxy]:
    deployments = [ark_deployment(name, pool, max_output_tokens=4096) for name, (pool, _) in POOLS.items()]
    p = start_syncing_proxy(tmp_path_factory.mktemp("retries"), fake, store_url, prefix,
                            dict(POOLS.values()), deployments,
                            VQG_SMALL_BUFFER=str(BUFFER), VQG_EVICT_BELOW="100")
    yield p
    stop_proxy(p)


def post(px: Proxy, path: str, body: dict[str, Any], cid: str) -> httpx.Response:
    return httpx.post(f"{px.url}{path}", json=body, timeout=60,
                      headers={"authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": cid})


def settled(px: Proxy, pool: str) -> None:
    deadline = time.monotonic() + 20
    while px.state(pool).get("inflight") and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize(("model", "extra"), [("rt-big", {}), ("rt-wall", {}),
                                             ("rt-wall5", {"num_retries": 5})])
def test_each_retry_after_ark_answered_holds_its_own_reservation(px: Proxy, model: str,
                                                                 extra: dict[str, Any]) -> None:
    pool = POOLS[model][0]
    cid, before = call_id(), len(px.fake.chat_requests())
    body = {"model": model, "max_tokens": 3000, "response_format": SCHEMA,
            "enable_json_schema_validation": True, "allowed_openai_params": ["response_format"],
            "messages": [{"role": "user", "content": "hi [[fake completion=3000 reasoning=8000]]"}], **extra}
    post(px, "/v1/chat/completions", body, cid)
    settled(px, pool)
    new = px.fake.chat_requests()[before:]
    assert new, "the request reached Ark"
    lines = px.wait_for_log(rf"\[Usage\].*call={cid}\b", count=len(new), timeout=30)
    held = sum(int(m.group(1)) for ln in lines if (m := RESERVED.search(ln)))
    assert held >= sum(c.consumed for c in new), (held, [c.consumed for c in new], lines)
    assert px.state(pool).get("inflight") == 0  # nothing left to expire at the TTL
    assert px.fake.pool_totals(pool).billed == 0


def test_a_messages_call_rides_one_reservation_for_its_two_halves(px: Proxy) -> None:
    """/v1/messages runs the hook on the Anthropic call and on its translated chat call: one
    reservation, one Usage line, settled at what Ark reported."""
    pool = POOLS["rt-msg"][0]
    cid, before = call_id(), len(px.fake.chat_requests())
    ask = [{"role": "user", "content": "hi [[fake completion=300]]"}]
    r = post(px, "/v1/messages", {"model": "rt-msg", "max_tokens": 500, "messages": ask}, cid)
    assert r.status_code == 200, r.text[:300]
    settled(px, pool)
    [record] = px.fake.chat_requests()[before:]
    [line] = px.wait_for_log(rf"\[Usage\].*call={cid}\b")
    assert "source=measured" in line and f"+{record.consumed}" in line, line
    assert px.state(pool).get("inflight") == 0
