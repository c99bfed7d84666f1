"""The guard inside a real LiteLLM proxy: admit, clamp, block, route around, settle."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from proxy_support import (
    DS,
    MASTER_KEY,
    POOL_A,
    POOL_B,
    POOL_DOUBAO,
    POOL_NOSNAP,
    POOL_SOLO,
    Proxy,
    call_id,
    start_proxy,
    stop_proxy,
)

from volc_quota_guard import counting
from volc_quota_guard.clock import next_beijing_midnight_ms
from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy

ALL_POOLS = (POOL_A, POOL_B, POOL_DOUBAO, POOL_SOLO)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
          prefix: str) -> Iterator[Proxy]:
    """One proxy for the module, its pools seeded with plenty of headroom."""
    p = start_proxy(tmp_path_factory.mktemp("proxy"), fake, store_url, prefix)
    for pool in ALL_POOLS:
        p.seed(pool, 1_000_000)
    yield p
    stop_proxy(p)


@pytest.fixture(autouse=True)
def _fresh(proxy: Proxy) -> None:
    """Every test starts with roomy pools and an empty upstream request log."""
    proxy.fake.clear_chat_requests()
    for pool in ALL_POOLS:
        proxy.seed(pool, 1_000_000)


def ask(proxy: Proxy, model: str, text: str = "hello", cid: str | None = None,
        headers: dict[str, str] | None = None, **params: Any) -> httpx.Response:
    """POST /v1/chat/completions with our own call id (the guard logs it)."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], **params}
    return httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=60,
                      headers={"authorization": f"Bearer {MASTER_KEY}",
                               "x-litellm-call-id": cid or call_id(), **(headers or {})})


def usage_line(proxy: Proxy, cid: str) -> str:
    return proxy.wait_for_log(rf"\[Usage\].*call={cid}")[-1]


def counted(line: str) -> int:
    return int(re.search(r"counted=(\d+)", line).group(1))


# ---- pass, settle, stream -------------------------------------------------------------------

def test_guarded_request_passes_and_settles_measured_usage(proxy: Proxy) -> None:
    """A request that fits passes, and the upstream's usage is settled and logged as measured."""
    cid = call_id()
    r = proxy.client().chat.completions.with_raw_response.create(
        model="deepseek-v4-flash", max_tokens=200,
        messages=[{"role": "user", "content": "hi [[fake prompt=120 completion=80]]"}],
        extra_headers={"x-litellm-call-id": cid})
    assert r.http_response.status_code == 200
    line = usage_line(proxy, cid)
    assert re.search(rf"📊 \[Usage\] {DS}:[0-9a-f]{{8}}: \+200 \(Today: [\d,]+ \| BalAtSync: "
                     rf"[\d,]+ \| Limit: [\d,]+\)", line), line
    assert "source=measured" in line and counted(line) == 200


def test_stream_forces_include_usage_upstream_and_settles_measured(proxy: Proxy) -> None:
    """A stream gets `include_usage` upstream (without the client asking) and settles measured usage."""
    cid = call_id()
    stream = proxy.client().chat.completions.create(
        model="deepseek-v4-flash", max_tokens=300, stream=True,
        messages=[{"role": "user", "content": "hi [[fake prompt=50 completion=40]]"}],
        extra_headers={"x-litellm-call-id": cid})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert "Fake reply" in text
    line = usage_line(proxy, cid)
    assert "+90 " in line and "source=measured" in line
    assert [r.include_usage for r in proxy.fake.chat_requests()] == [True]


def test_anthropic_messages_route_reserves_once(proxy: Proxy) -> None:
    """/v1/messages runs the deployment hook twice; the pool is charged exactly once."""
    proxy.seed(POOL_A, 5_000)
    proxy.seed(POOL_B, 5_000)
    before = proxy.state(POOL_A).get("ucum") + proxy.state(POOL_B).get("ucum")
    cid = call_id()
    r = httpx.post(f"{proxy.url}/v1/messages", timeout=60,
                   headers={"authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": cid},
                   json={"model": "deepseek-v4-flash", "max_tokens": 100, "messages": [
                       {"role": "user", "content": "hi [[fake prompt=30 completion=20]]"}]})
    assert r.status_code == 200, r.text
    usage_line(proxy, cid)
    after = proxy.state(POOL_A).get("ucum") + proxy.state(POOL_B).get("ucum")
    assert after - before == 50
    assert proxy.state(POOL_A).get("inflight") == proxy.state(POOL_B).get("inflight") == 0


# ---- block -----------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_exhausted_pool_answers_429_with_retry_after_and_preblock_log(proxy: Proxy,
                                                                     stream: bool) -> None:
    """An exhausted single-deployment model gets 429 + Retry-After naming the model, and a PRE-BLOCK line."""
    proxy.seed(POOL_SOLO, 100)  # below evict_below: the pool leaves routing
    cid = call_id()
    with pytest.raises(openai.RateLimitError) as err:
        proxy.client().chat.completions.create(
            model="solo", max_tokens=50, stream=stream,
            messages=[{"role": "user", "content": "hi"}], extra_headers={"x-litellm-call-id": cid})
    message = err.value.response.json()["error"]["message"]
    assert "'solo'" in message and "free token quota exhausted" in message
    assert int(err.value.response.headers["retry-after"]) > 0
    line = proxy.wait_for_log(rf"PRE-BLOCK.*call={cid}")[0]
    assert re.search(r"🚫 \[PRE-BLOCK\] solo-model-260101 daily limit reached "
                     r"\([\d,]+\+[\d,]+/[\d,]+\)", line), line
    assert proxy.fake.chat_requests() == []


def test_request_too_big_for_headroom_is_refused_by_the_gate(proxy: Proxy) -> None:
    """When even the input does not fit, the gate refuses with 429 and nothing reaches the upstream."""
    proxy.seed(POOL_SOLO, 3_000)  # routable, but smaller than the prompt
    cid = call_id()
    r = ask(proxy, "solo", "word " * 4_000, cid=cid, max_tokens=10)
    assert r.status_code == 429, r.text
    assert "free token quota exhausted" in r.json()["error"]["message"]
    assert int(r.headers["retry-after"]) > 0
    assert "reason=balance_wall" in proxy.wait_for_log(rf"PRE-BLOCK.*call={cid}")[0]
    assert proxy.fake.chat_requests() == []


def test_pool_without_snapshot_fails_closed(proxy: Proxy) -> None:
    """A pool that never had a billing snapshot is refused (429), never passed unguarded."""
    cid = call_id()
    r = ask(proxy, "nosnap", cid=cid, max_tokens=10)
    assert r.status_code == 429 and "no quota snapshot" in r.json()["error"]["message"]
    assert "reason=no_snapshot" in proxy.wait_for_log(rf"PRE-BLOCK.*call={cid}")[0]
    assert proxy.fake.chat_requests() == []
    assert not proxy.gate.client.exists(proxy.gate.args.keys(POOL_NOSNAP).reservations)


# ---- clamp -----------------------------------------------------------------------------------

def test_clamp_lowers_the_upstream_max_tokens_and_says_so(proxy: Proxy) -> None:
    """Short headroom lowers max_tokens upstream to what fits, with a header and a CLAMP line."""
    proxy.seed(POOL_SOLO, 1_500)
    cid = call_id()
    r = ask(proxy, "solo", "hi [[fake prompt=10 completion=4000]]", cid=cid, max_tokens=4_000)
    assert r.status_code == 200, r.text
    clamped = int(r.headers["x-vqg-clamped-max-tokens"])
    [record] = proxy.fake.chat_requests()
    assert record.max_completion_tokens == clamped < 1_500 and record.max_tokens is None
    assert r.json()["usage"]["completion_tokens"] == clamped
    assert f"-> {clamped}" in proxy.wait_for_log(rf"CLAMP.*call={cid}")[0]
    usage_line(proxy, cid)
    st = proxy.state(POOL_SOLO)
    assert st.decision.used_balance <= st.decision.balance_wall


def test_client_without_max_tokens_gets_the_reserved_cap_pinned(proxy: Proxy) -> None:
    """With no client max_tokens the upstream still gets the reserved cap (answer + reasoning
    allowance, as max_completion_tokens), so output cannot outrun it."""
    cid = call_id()
    assert ask(proxy, "solo", cid=cid).status_code == 200
    assert [(r.max_tokens, r.max_completion_tokens) for r in proxy.fake.chat_requests()] == [
        (None, 4096)]  # model_info.max_output_tokens (solo has no reasoning allowance)


def test_client_without_max_tokens_gets_arks_default_not_the_models_maximum(proxy: Proxy) -> None:
    """A deployment whose model may answer 32,768 tokens pins Ark's own default (4,096) on a call
    that sets no cap, and a client's larger cap is kept: the guard holds no more than Ark makes."""
    off = {"extra_body": {"thinking": {"type": "disabled"}}}
    assert ask(proxy, "deepseek-v4-flash", **off).status_code == 200
    assert ask(proxy, "deepseek-v4-flash", max_tokens=20_000, **off).status_code == 200
    assert [r.max_completion_tokens for r in proxy.fake.chat_requests()] == [4_096, 20_000]


# ---- routing ---------------------------------------------------------------------------------

def served_by(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.headers["x-litellm-model-id"]


def test_fallback_to_second_account_and_back_when_limit_rises(proxy: Proxy) -> None:
    """An exhausted account leaves routing (acct-b serves), and returns once its limit rises."""
    proxy.seed(POOL_A, 500)
    assert {served_by(ask(proxy, "deepseek-v4-flash", max_tokens=20)) for _ in range(4)} == \
        {"deepseek-v4-flash@acct-b"}
    proxy.seed(POOL_A, 1_000_000)  # a sync found the return package
    proxy.seed(POOL_B, 500)
    assert {served_by(ask(proxy, "deepseek-v4-flash", max_tokens=20)) for _ in range(4)} == \
        {"deepseek-v4-flash@acct-a"}


def test_fallback_model_group_serves_when_both_accounts_are_exhausted(proxy: Proxy) -> None:
    """Both accounts evicted: the configured fallback group answers; with it exhausted too, a clean 429."""
    proxy.seed(POOL_A, 500)
    proxy.seed(POOL_B, 500)
    assert served_by(ask(proxy, "deepseek-v4-flash", max_tokens=20)) == "doubao-seed@acct-a"
    proxy.seed(POOL_DOUBAO, 500)
    r = ask(proxy, "deepseek-v4-flash", max_tokens=20)
    assert r.status_code == 429
    assert "'deepseek-v4-flash'" in r.json()["error"]["message"]
    assert int(r.headers["retry-after"]) > 0


def test_64_concurrent_requests_near_the_wall_never_overrun(proxy: Proxy) -> None:
    """64 parallel requests against ~60k of headroom: admitted work never exceeds any pool's wall."""
    headroom = 20_000
    for pool in (POOL_A, POOL_B, POOL_DOUBAO):
        proxy.seed(pool, headroom)

    def one(i: int) -> tuple[str, int]:
        cid = call_id()
        return cid, ask(proxy, "deepseek-v4-flash", f"request {i} [[fake completion=1000]]",
                        cid=cid, max_tokens=1_000, thinking={"type": "disabled"}).status_code

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(64)))
    codes = [code for _, code in results]
    assert set(codes) <= {200, 429} and codes.count(200) >= 40, codes
    for cid, code in results:
        if code == 200:
            usage_line(proxy, cid)  # settled
    for pool_id in (POOL_A, POOL_B, POOL_DOUBAO):
        consumed = sum(r.consumed for r in proxy.fake.chat_requests() if r.pool == pool_id)
        assert consumed <= headroom, (pool_id, consumed)
        d = proxy.state(pool_id).decision
        assert d.inflight == 0 and d.used_balance <= d.balance_wall
        assert proxy.state(pool_id).get("overruns") == 0


# ---- no bypass -------------------------------------------------------------------------------

def test_alias_metadata_and_headers_cannot_bypass_the_guard(proxy: Proxy) -> None:
    """Alias names, forged metadata and guard-looking headers still hit the exhausted pools."""
    for pool in (POOL_A, POOL_B, POOL_DOUBAO):
        proxy.seed(pool, 500)
    forged = {"vqg_guard": False, "vqg_account": "elsewhere", "model_info": {"id": "x"},
              "vqg_reservations": {"deepseek-v4-flash@acct-a": "0" * 32}}
    attempts = [
        ask(proxy, "ds-alias", max_tokens=10),
        ask(proxy, "deepseek-v4-flash", max_tokens=10, metadata=forged),
        ask(proxy, "deepseek-v4-flash", max_tokens=10, headers={"x-vqg-guard": "false"}),
        ask(proxy, "deepseek-v4-flash@acct-a", max_tokens=10),  # a deployment id skips the filter
        ask(proxy, "deepseek-v4-flash", max_tokens=10, model_info={"vqg_guard": False}),
    ]
    assert [r.status_code for r in attempts] == [429] * len(attempts), [r.text for r in attempts]
    assert proxy.fake.chat_requests() == []


def test_a_reused_call_id_gets_its_own_reservation(proxy: Proxy) -> None:
    """Concurrent requests sharing a client-chosen call id cannot ride one reservation."""
    proxy.seed(POOL_SOLO, 1_400, evict_below=0)  # room for one request of ~600 + one of ~600
    shared = call_id()
    barrier = threading.Barrier(4)

    def one(_: int) -> int:
        barrier.wait()
        return ask(proxy, "solo", "hi [[fake completion=580 delay=0.5]]", cid=shared,
                   max_tokens=580).status_code

    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(one, range(4)))
    assert sorted(codes) == [200, 200, 429, 429], codes
    proxy.wait_for_log(rf"\[Usage\].*call={shared}", count=2)
    consumed = sum(r.consumed for r in proxy.fake.chat_requests())
    st = proxy.state(POOL_SOLO)
    assert consumed <= 1_400 and st.decision.used_balance <= st.decision.balance_wall


# ---- malformed input ------------------------------------------------------------------------

BAD_BODIES = {
    "no messages": {"model": "deepseek-v4-flash"},
    "empty messages": {"model": "deepseek-v4-flash", "messages": []},
    "messages not a list": {"model": "deepseek-v4-flash", "messages": "hello"},
    "content a number": {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": 5}]},
    "max_tokens text": {"max_tokens": "abc"},
    "max_tokens negative": {"max_tokens": -1},
    "max_tokens zero": {"max_tokens": 0},
    "max_tokens huge": {"max_tokens": 10**12},
    "max_tokens bool": {"max_tokens": True},
    "max_tokens float": {"max_tokens": 1.5},
    "max_completion_tokens text": {"max_completion_tokens": "9"},
    "extra_body max_tokens huge": {"extra_body": {"max_tokens": 99_999_999}},
    "unknown model": {"model": "no-such-model"},
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_malformed_requests_get_a_clear_4xx_and_never_reach_the_upstream(proxy: Proxy,
                                                                         case: str) -> None:
    """Malformed bodies answer 4xx with a message, never 500, and nothing is sent upstream."""
    body = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "hi"}],
            **BAD_BODIES[case]}
    if case == "no messages":
        del body["messages"]
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=60,
                   headers={"authorization": f"Bearer {MASTER_KEY}"})
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert r.json()["error"]["message"]
    assert proxy.fake.chat_requests() == []


def test_image_parts_and_tool_calls_are_guarded(proxy: Proxy) -> None:
    """Image parts and tool-call conversations pass through the gate and are settled."""
    image = [{"type": "text", "text": "what is this"},
             {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    convo = [{"role": "user", "content": "call f"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    for messages, extra in (([{"role": "user", "content": image}], {}),
                            (convo, {"tools": tools})):
        cid = call_id()
        r = httpx.post(f"{proxy.url}/v1/chat/completions", timeout=60,
                       headers={"authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": cid},
                       json={"model": "solo", "messages": messages, "max_tokens": 30, **extra})
        assert r.status_code == 200, r.text
        assert "source=measured" in usage_line(proxy, cid)


# ---- upstream outcomes -----------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_missing_upstream_usage_keeps_the_reservation(proxy: Proxy, stream: bool) -> None:
    """Usage missing (also LiteLLM's local count on a stream) is not measured: the reservation is
    kept, its prompt counted at the miscount ceiling."""
    cid = call_id()
    before = proxy.state(POOL_SOLO).get("ucum")
    text = "hi [[fake prompt=10 completion=20 usage=missing]]"
    r = ask(proxy, "solo", text, cid=cid, max_tokens=500, stream=stream)
    assert r.status_code == 200
    line = usage_line(proxy, cid)
    assert re.search(r"source=(unavailable|estimated)", line), line
    reserved = int(re.search(r"reserved=(\d+)", line).group(1))
    # Kept whole, its prompt at the miscount ceiling (3.0 x its count, not the k it was held at).
    prompt = counting.cl100k_chat([{"role": "user", "content": text}], None)
    assert reserved > 500 and reserved < counted(line) <= reserved + 3 * prompt
    assert proxy.state(POOL_SOLO).get("ucum") - before == counted(line)


def test_stream_cut_mid_way_keeps_the_reservation(proxy: Proxy) -> None:
    """A stream that breaks after a few chunks may have been billed in full: the reservation stays."""
    cid = call_id()
    before = proxy.state(POOL_SOLO).get("ucum")
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", timeout=60,
                      headers={"authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": cid},
                      json={"model": "solo", "stream": True, "max_tokens": 600, "messages": [
                          {"role": "user", "content": "hi [[fake completion=500 cut=2]]"}]}) as r:
        assert r.status_code == 200
        try:
            r.read()
        except httpx.HTTPError:
            pass  # the proxy may pass the break on to us
    line = usage_line(proxy, cid)
    assert "source=unavailable" in line or "source=estimated" in line, line
    reserved = int(re.search(r"reserved=(\d+)", line).group(1))
    prompt = counting.cl100k_chat([{"role": "user", "content": "hi [[fake completion=500 cut=2]]"}], None)
    assert reserved > 600 and reserved < counted(line) <= reserved + 3 * prompt
    assert proxy.state(POOL_SOLO).get("ucum") - before == counted(line)


def test_upstream_timeout_keeps_the_reservation(proxy: Proxy) -> None:
    """A timed-out upstream call may have run: its reservation stays counted."""
    cid = call_id()
    before = proxy.state(POOL_SOLO).get("ucum")
    r = ask(proxy, "solo", "hi [[fake delay=3]]", cid=cid, max_tokens=100, timeout=1)
    assert r.status_code == 408, r.text
    lines = proxy.wait_for_log(rf"\[Usage\].*call={cid}")
    assert all("outcome=Timeout" in ln and "source=unavailable" in ln for ln in lines)
    assert proxy.state(POOL_SOLO).get("ucum") - before == sum(counted(ln) for ln in lines) > 100


@pytest.mark.parametrize("status", [400, 429])
def test_upstream_4xx_releases_the_reservation(proxy: Proxy, status: int) -> None:
    """An upstream 4xx refused the work: the reservation is released, usage unchanged."""
    cid = call_id()
    before = proxy.state(POOL_SOLO).get("ucum")
    r = ask(proxy, "solo", f"hi [[fake status={status}]]", cid=cid, max_tokens=100)
    assert r.status_code == status, r.text
    proxy.wait_for_log(rf"\[RELEASE\].*call={cid}")
    st = proxy.state(POOL_SOLO)
    assert st.get("ucum") == before and st.get("inflight") == 0


def test_connection_refused_releases_the_reservation(proxy: Proxy) -> None:
    """An upstream that refuses the connection consumed nothing: released."""
    proxy.seed(POOL_SOLO, 50_000)
    cid = call_id()
    before = proxy.state(POOL_SOLO).get("ucum")
    r = ask(proxy, "unreachable", cid=cid, max_tokens=100)
    assert r.status_code >= 500
    proxy.wait_for_log(rf"\[RELEASE\].*call={cid}")
    st = proxy.state(POOL_SOLO)
    assert st.get("ucum") == before and st.get("inflight") == 0


# ---- not guarded -----------------------------------------------------------------------------

def test_other_providers_and_opted_out_deployments_pass_untouched(proxy: Proxy) -> None:
    """A non-Volcengine deployment and a `vqg_guard: false` one pass with no reservation."""
    cids = []
    for model in ("other-provider", "optout"):
        cids.append(call_id())
        r = ask(proxy, model, cid=cids[-1], max_tokens=7)
        assert r.status_code == 200, r.text
    assert [r.max_tokens for r in proxy.fake.chat_requests()] == [7, 7]  # not pinned or clamped
    assert "optout-model" not in json.dumps(proxy.gate.pools())
    ask(proxy, "solo", cid=(marker := call_id()), max_tokens=7)  # a later guarded request ...
    usage_line(proxy, marker)  # ... whose Usage line is logged after theirs would have been
    assert not any(cid in proxy.log() for cid in cids)


def test_collection_wall_blocks_until_beijing_midnight(proxy: Proxy) -> None:
    """A pool at its daily collection cap is refused with Retry-After running to Beijing midnight."""
    proxy.seed(POOL_SOLO, 1_000_000, daily_headroom=100)
    r = ask(proxy, "solo", max_tokens=10)
    assert r.status_code == 429, r.text
    midnight = next_beijing_midnight_ms(int(time.time() * 1000))
    wait = int(r.headers["retry-after"])
    assert abs(wait - (midnight / 1000 - time.time())) < 120
    assert "wall=collection" in proxy.wait_for_log(r"PRE-BLOCK\] solo-model")[-1]


def test_log_file_has_no_guard_tracebacks(proxy: Proxy) -> None:
    """After everything above, the guard itself never logged an internal error."""
    text = Path(proxy.log_path).read_text(errors="replace")
    assert "guard error" not in text and "hook failed" not in text
    assert "settle after" not in text
