"""The fake Ark chat endpoint and the admin API over the wire."""

from __future__ import annotations

import json
import os
import time

import httpx
import openai
import pytest
from vc_support import AUTH, HTTP, MODEL, POOL_A, chat, sse_events

from volc_quota_guard.fake import FakeVolcengine


def test_a_completion_reports_the_directive_usage_and_charges_the_ledger(
        fake: FakeVolcengine) -> None:
    """Usage follows the [[fake …]] directive and prompt+completion leave the pool at once."""
    fake.add_package(POOL_A, 100_000)
    r = chat(fake, "hi [[fake prompt=1000 completion=500 cached=200]]")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["usage"]["prompt_tokens"] == 1000
    assert body["usage"]["completion_tokens"] == 500
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 200
    assert body["choices"][0]["finish_reason"] == "stop"
    assert fake.pool_totals(POOL_A).true_balance == 100_000 - 1500
    (rec,) = fake.chat_requests()
    assert (rec.pool, rec.consumed, rec.billed, rec.usage_reported) == (POOL_A, 1500, 0, True)


def test_the_output_cap_reaches_upstream_and_clamps_completion(fake: FakeVolcengine) -> None:
    """max_tokens / max_completion_tokens are recorded and cap the completion (finish=length)."""
    r = chat(fake, "[[fake prompt=10 completion=500]]", max_tokens=120)
    assert r.json()["usage"]["completion_tokens"] == 120
    assert r.json()["choices"][0]["finish_reason"] == "length"
    chat(fake, "[[fake prompt=10 completion=500]]", max_completion_tokens=90)
    first, second = fake.chat_requests()
    assert (first.max_tokens, first.max_completion_tokens, first.consumed) == (120, None, 130)
    assert (second.max_tokens, second.max_completion_tokens, second.completion_tokens) == (
        None, 90, 90)


def test_consumption_beyond_the_balance_is_billed(fake: FakeVolcengine) -> None:
    """A request larger than the free balance is served and the excess is billed."""
    fake.add_package(POOL_A, 1000)
    chat(fake, "[[fake prompt=800 completion=700]]")
    assert fake.pool_totals(POOL_A).billed == 500
    assert fake.chat_requests()[0].billed == 500


def test_streaming_with_include_usage_ends_with_a_usage_chunk_and_done(
        fake: FakeVolcengine) -> None:
    """A stream with include_usage has content chunks, a finish chunk, one usage-only chunk
    with empty choices, then [DONE]."""
    r = chat(fake, "[[fake prompt=40 completion=7]]", stream=True,
             stream_options={"include_usage": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["total_tokens"] == 47
    assert all(e["usage"] is None for e in events[:-2])
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
    assert "40 prompt + 7 completion" in text
    assert fake.pool_totals(POOL_A).consumed == 47


def test_streaming_without_include_usage_has_no_usage_but_still_charges(
        fake: FakeVolcengine) -> None:
    """Without stream_options.include_usage no chunk carries usage; the ledger is charged."""
    r = chat(fake, "[[fake prompt=40 completion=7]]", stream=True)
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert not any("usage" in e for e in events[:-1])
    assert fake.pool_totals(POOL_A).consumed == 47
    assert fake.chat_requests()[0].usage_reported is False


def test_the_openai_sdk_streams_from_the_fake(fake: FakeVolcengine) -> None:
    """The official OpenAI client reads the fake's stream, usage included."""
    client = openai.OpenAI(base_url=fake.ark_base_url, api_key="ark-key-a", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "[[fake prompt=5 completion=3]]"}],
        stream=True, stream_options={"include_usage": True}, max_completion_tokens=2)
    chunks = list(stream)
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (5, 2)


def test_usage_missing_omits_usage_but_not_consumption(fake: FakeVolcengine) -> None:
    """usage=missing drops the usage object; the upstream still consumed the tokens."""
    body = chat(fake, "[[fake prompt=100 completion=50 usage=missing]]").json()
    assert "usage" not in body
    events = sse_events(chat(fake, "[[fake prompt=100 completion=50 usage=missing]]",
                             stream=True, stream_options={"include_usage": True}))
    assert not any(isinstance(e, dict) and e.get("usage") for e in events)
    assert fake.pool_totals(POOL_A).consumed == 300


def test_an_error_status_returns_openai_error_json_and_consumes_nothing(
        fake: FakeVolcengine) -> None:
    """status=429 answers an OpenAI-style error body and charges nothing."""
    r = chat(fake, "[[fake prompt=100 status=429]]")
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "RateLimitExceeded"
    assert fake.pool_totals(POOL_A).consumed == 0
    assert fake.chat_requests()[0].status == 429


def test_a_delay_can_time_the_client_out_while_the_upstream_still_charges(
        fake: FakeVolcengine) -> None:
    """delay=0.4 outlasts a 0.1 s client timeout; the upstream finishes and consumes anyway."""
    payload = {"model": MODEL,
               "messages": [{"role": "user", "content": "[[fake prompt=9 completion=1 delay=0.4]]"}]}
    with pytest.raises(httpx.ReadTimeout):
        HTTP.post(f"{fake.ark_base_url}/chat/completions", json=payload, headers=AUTH,
                   timeout=0.1)
    deadline = time.monotonic() + 3
    while not fake.chat_requests() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.pool_totals(POOL_A).consumed == 10


def test_a_cut_stream_breaks_mid_body_and_still_charges(fake: FakeVolcengine) -> None:
    """cut=2 drops the connection after two content chunks: no usage, no [DONE]."""
    received = []
    with pytest.raises(httpx.RemoteProtocolError), HTTP.stream(
            "POST", f"{fake.ark_base_url}/chat/completions", headers=AUTH, timeout=5,
            json={"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
                  "messages": [{"role": "user", "content": "[[fake prompt=3 completion=4 cut=2]]"}]},
    ) as r:
        for line in r.iter_lines():
            received.append(line)
    assert not any("[DONE]" in line for line in received)
    assert fake.pool_totals(POOL_A).consumed == 7


def test_the_default_prompt_count_is_litellms_token_counter(fake: FakeVolcengine) -> None:
    """Without prompt=, a model neither DeepSeek nor Doubao has prompt_tokens =
    litellm.token_counter(gpt-3.5-turbo)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    messages = [{"role": "system", "content": "你是一个助手"},
                {"role": "user", "content": "Summarise the quota rules [[fake completion=1]]"}]
    r = HTTP.post(f"{fake.ark_base_url}/chat/completions", headers=AUTH, timeout=30,
                   json={"model": "kimi-k2-250905", "messages": messages})
    expected = litellm.token_counter(model="gpt-3.5-turbo", messages=messages)
    assert r.json()["usage"]["prompt_tokens"] == expected > 10


def test_a_deepseek_prompt_counts_more_than_the_guards_exact_count(fake: FakeVolcengine) -> None:
    """A deepseek* model is counted with the DeepSeek-V4 tokenizer and template plus the fake's
    hidden drift (+3%, +2 per message): above the guard's exact count, within its 1.1 floor."""
    from volc_quota_guard import counting

    text = "请把免费额度的规则总结成三条要点，并说明什么时候开始计费。" * 20
    messages = [{"role": "system", "content": "你是一个助手"},
                {"role": "user", "content": text + " [[fake completion=1]]"}]
    r = HTTP.post(f"{fake.ark_base_url}/chat/completions", headers=AUTH, timeout=30,
                   json={"model": MODEL, "messages": messages})
    exact = counting.count_chat("deepseek", messages, None)
    assert r.json()["usage"]["prompt_tokens"] == -(-exact * 103 // 100) + 2 * 2
    assert exact < r.json()["usage"]["prompt_tokens"] <= exact * 1.1
    for_other = HTTP.post(f"{fake.ark_base_url}/chat/completions", headers=AUTH, timeout=30,
                          json={"model": "kimi-k2-250905", "messages": messages})
    assert for_other.json()["usage"]["prompt_tokens"] > exact * 1.1  # cl100k over-counts Chinese


def test_a_doubao_prompt_is_the_tokenization_apis_count_plus_a_hidden_template_and_drift(
        fake: FakeVolcengine) -> None:
    """Doubao bills what POST /tokenization answers for each message's text (and other fields,
    and the tools) + 4% + 5 tokens per message and for the tools: more than the text count the
    guard can ask for, within its exact floor (count + 8 per message, x 1.1); the hidden
    template can be raised per fake; a cl100k count x 1.7 still covers it."""
    from volc_quota_guard import counting
    from volc_quota_guard.fake.ark_api import doubao_control

    text = "请把免费额度的规则总结成三条要点，并说明什么时候开始计费。" * 20
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    messages = [{"role": "system", "content": "你是一个助手"},
                {"role": "user", "content": text + " [[fake completion=1]]", "name": "ann"}]
    texts = ["你是一个助手", text + " [[fake completion=1]]", '{"name": "ann"}',
             json.dumps(tools, ensure_ascii=False)]
    told = HTTP.post(f"{fake.ark_base_url}/tokenization", headers=AUTH, timeout=30,
                     json={"model": "doubao-seed-2-1-pro-260628", "text": texts}).json()
    counted = sum(item["total_tokens"] for item in told["data"])

    def bill() -> int:
        r = HTTP.post(f"{fake.ark_base_url}/chat/completions", headers=AUTH, timeout=30,
                      json={"model": "doubao-seed-2-1-pro-260628", "messages": messages, "tools": tools})
        return int(r.json()["usage"]["prompt_tokens"])

    assert bill() == -(-counted * 104 // 100) + 5 * 3
    assert counted < bill() <= (counted + 8 * 2) * 1.1
    assert bill() < counting.count_chat("cl100k", messages, tools) * 1.7
    control = doubao_control(fake)
    control.template_tokens = 60
    try:
        assert bill() == -(-counted * 104 // 100) + 60 * 3
    finally:
        control.template_tokens = 5


def test_bad_keys_and_bad_directives_are_rejected(fake: FakeVolcengine) -> None:
    """An unknown Bearer key is 401; a typo in a directive is 400 (never silently ignored)."""
    r = HTTP.post(f"{fake.ark_base_url}/chat/completions", timeout=5,
                   headers={"Authorization": "Bearer nope"},
                   json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 401
    assert chat(fake, "[[fake promt=5]]").status_code == 400
    assert fake.pool_totals(POOL_A).consumed == 0


def test_the_bearer_key_picks_the_account_pool(fake: FakeVolcengine) -> None:
    """acct-b's key charges acct-b's pool of the same model, not acct-a's."""
    HTTP.post(f"{fake.ark_base_url}/chat/completions", timeout=5,
               headers={"Authorization": "Bearer ark-key-b"},
               json={"model": MODEL, "messages": [{"role": "user",
                                                   "content": "[[fake prompt=1 completion=1]]"}]})
    assert fake.pool_totals(f"acct-b/{MODEL}").consumed == 2
    assert fake.pool_totals(POOL_A).consumed == 0


def test_server_defaults_apply_when_the_directive_is_silent(fake: FakeVolcengine) -> None:
    """Defaults set through the admin API (prompt, completion, cached policy) are used."""
    r = HTTP.post(f"{fake.url}/_fake/defaults", timeout=5,
                   json={"prompt_tokens": 70, "completion_tokens": 30, "cached_tokens": 20,
                         "count_cached": False})
    assert r.json()["completion_tokens"] == 30
    usage = chat(fake, "plain question").json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (70, 30)
    assert fake.pool_totals(POOL_A).consumed == 70 + 30 - 20


def test_the_admin_api_drives_packages_faults_clock_and_records(fake: FakeVolcengine) -> None:
    """Packages, collection, faults, clock and the request log are all reachable over HTTP."""
    base = f"{fake.url}/_fake"
    no = HTTP.post(f"{base}/packages", json={"pool": POOL_A, "amount": 5000}).json()
    assert no["instance_no"].startswith("PackageProduct")
    replaced = HTTP.post(f"{base}/packages", json={
        "pool": POOL_A, "replace": True, "packages": [{"amount": 700}, {"amount": 300}]}).json()
    assert len(replaced["instance_nos"]) == 2
    HTTP.post(f"{base}/consume", json={"pool": POOL_A, "tokens": 100})
    pool = HTTP.get(f"{base}/pool", params={"pool": POOL_A}).json()
    assert pool["totals"]["true_balance"] == 900
    assert pool["totals"]["api_balance"] == 1000  # the 14-minute lag
    now = HTTP.get(f"{base}/clock").json()["now_ms"]
    assert HTTP.post(f"{base}/clock", json={"advance_ms": 15 * 60_000}).json()["now_ms"] == \
        now + 15 * 60_000
    assert HTTP.get(f"{base}/pool", params={"pool": POOL_A}).json()["totals"]["api_balance"] \
        == 900
    assert HTTP.post(f"{base}/billing/faults", json={"kind": "throttle", "count": 2}) \
        .status_code == 200
    assert fake.take_billing_fault("acct-a") == "throttle"
    assert HTTP.post(f"{base}/billing/faults", json={"kind": "nope"}).status_code == 400
    chat(fake, "[[fake prompt=1 completion=1]]", max_tokens=5)
    (rec,) = HTTP.get(f"{base}/chat/requests").json()
    assert rec["max_tokens"] == 5
    state = HTTP.get(f"{base}/state").json()
    assert state["pools"][POOL_A]["consumed"] == 102
    assert state["accounts"] == ["acct-a", "acct-b"]
    assert HTTP.get(f"{base}/nothing").status_code == 404
