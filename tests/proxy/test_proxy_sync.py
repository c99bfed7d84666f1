"""The proxy's own billing sync: no hand-seeded snapshot, the fake's billing API is the only source."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from proxy_support import DS, POOL_A, POOL_B, Proxy, call_id, start_proxy, stop_proxy, sync_env

from volc_quota_guard import counting
from volc_quota_guard.admission import EXACT_DRIFT_TOKENS
from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy
POOL_DOUBAO = "acct-a/doubao-seed-2-1-pro-260628"


@pytest.fixture(scope="module")
def synced(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
           prefix: str) -> Iterator[Proxy]:
    """A proxy whose sync thread reads the fake's ListResourcePackages (signed, over HTTP)."""
    fake.add_package(POOL_A, 60_000)
    fake.add_package(POOL_B, 40_000)
    fake.add_package(POOL_DOUBAO, 20_000)
    env = sync_env(fake, VQG_EVICT_BELOW="3000")
    p = start_proxy(tmp_path_factory.mktemp("sync"), fake, store_url, prefix, env=env,
                    config=_with_wildcard)
    yield p
    stop_proxy(p)


def _with_wildcard(config: dict[str, Any]) -> dict[str, Any]:
    """A `volcengine/*` wildcard deployment: it names no pool the sync could read."""
    config["model_list"].append({
        "model_name": "volcengine/*",
        "litellm_params": {"model": "volcengine/*", "api_base": "os.environ/VOLCENGINE_API_BASE",
                           "api_key": "os.environ/ARK_API_KEY_ACCT_A"},
        "model_info": {"id": "wildcard@acct-a", "vqg_account": "acct-a"}})
    return config


def test_a_wildcard_deployment_is_skipped_by_the_sync_and_refused_by_the_gate(synced: Proxy) -> None:
    """The sync thread logs the wildcard once and keeps syncing the other pools; a request routed
    to the wildcard is a clear 400, never an unguarded pass."""
    synced.wait_for_log(r"deployment skipped, its pool cannot be synced")
    synced.wait_for_log(rf"\[Sync\] {POOL_A}: Bal=")
    before = len(synced.fake.chat_requests())
    with pytest.raises(openai.BadRequestError, match="quota guard misconfigured"):
        synced.client().chat.completions.create(
            model="volcengine/some-model-260101", max_tokens=10,
            messages=[{"role": "user", "content": "hi"}])
    assert len(synced.fake.chat_requests()) == before
    assert "unexpected error" not in synced.log()
    assert "cannot read the guarded pools" not in synced.log()


ZH = "请把免费额度的规则总结成三条要点，并说明什么时候开始计费、怎样避免超额。" * 30


def test_a_deepseek_request_is_held_at_its_exact_count_and_covers_what_ark_bills(synced: Proxy) -> None:
    """A long Chinese request to a DeepSeek pool is held in the gate's exact class at the exact
    DeepSeek count × 1.1 — less than cl100k × 1.7, the cheap class's floor every pool keeps — and
    the fake, counting with the real tokenizer plus drift the guard is not told, consumes no
    more than was held; the settle teaches the exact class, not the cheap k."""
    synced.wait_for_log(rf"\[Sync\] {POOL_A}: Bal=")
    synced.wait_for_log(rf"\[Sync\] {POOL_B}: Bal=")
    synced.wait_for_log(rf"\[Sync\] {POOL_DOUBAO}: Bal=")
    assert [(synced.state(p).get("corr_min"), synced.state(p).get("corr_max"))
            for p in (POOL_A, POOL_B, POOL_DOUBAO)] == [(1_700_000, 3_000_000)] * 3
    messages = [{"role": "user", "content": ZH + " [[fake completion=60 delay=1.5]]"}]
    exact = counting.count_chat("deepseek", messages, None) + EXACT_DRIFT_TOKENS
    before = len(synced.fake.chat_requests())
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(synced.client().chat.completions.create(
        model="deepseek-v4-flash", max_tokens=100, messages=messages,  # type: ignore[arg-type]
        extra_body={"thinking": {"type": "disabled"}}, extra_headers={"x-litellm-call-id": call_id()})))
    worker.start()
    held: dict[str, int] = {}
    deadline = time.monotonic() + 20
    while not held and time.monotonic() < deadline:
        for pool in (POOL_A, POOL_B):
            st = synced.state(pool)
            if st.get("inflight"):
                held = {k: st.get(k) for k in ("inflight", "inflight_est", "inflight_xest",
                                               "inflight_xest_res")} | {"pool": pool}
        time.sleep(0.02)
    worker.join(30)
    assert done and held, (done, held)
    assert held["inflight_xest"] == exact and held["inflight_est"] == 0
    assert held["inflight_xest_res"] == -(-exact * 11 // 10)
    assert held["inflight"] == held["inflight_xest_res"] + 100
    record = synced.fake.chat_requests()[before]
    assert exact < record.prompt_tokens <= held["inflight_xest_res"]
    assert record.consumed <= held["inflight"]
    assert held["inflight_xest_res"] < counting.cl100k_chat(messages, None) * 1.7 * 0.5  # the gain
    deadline = time.monotonic() + 10  # the settle runs after the response reached the client
    while (after := synced.state(str(held["pool"]))).get("xcorr_n") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert after.get("xcorr_n") >= 1 and after.get("xcorr") >= record.prompt_tokens * 1_000_000 // exact


def test_sync_thread_installs_snapshots_and_traffic_stops_before_billing(synced: Proxy) -> None:
    """The proxy syncs by itself, serves from both accounts and the fallback, then 429s — billing 0."""
    synced.wait_for_log(rf"\[Sync\] {POOL_A}: Bal=60,000")
    synced.wait_for_log(rf"\[Sync\] {POOL_B}: Bal=40,000")
    assert synced.fake.api_calls("acct-a") >= 1
    client = synced.client()
    served = refused = 0
    for _ in range(80):
        try:
            client.chat.completions.create(
                model="deepseek-v4-flash", max_tokens=2_000, extra_headers={"x-litellm-call-id": call_id()},
                messages=[{"role": "user", "content": "[[fake prompt=500 completion=3500]] hi"}])
            served += 1
        except openai.RateLimitError as exc:
            refused += 1
            assert "free token quota exhausted" in str(exc)
            break
    totals = {p: synced.fake.pool_totals(p) for p in (POOL_A, POOL_B, POOL_DOUBAO)}
    assert refused == 1 and served >= 25
    assert all(t.billed == 0 for t in totals.values()), totals
    assert all(t.consumed > 0 for t in totals.values()), "both accounts and the fallback served"
    synced.wait_for_log(r"PRE-BLOCK")
    assert DS in synced.log()
