"""LiteLLM's /v1/responses, /v1/embeddings and chat extra_body reach the fake Ark through a
real proxy, with the paths and bodies the fake's billing rules read, and come back with usage."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from proxy_support import POOL_SOLO, Proxy, call_id, start_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine, UpstreamRequest

pytestmark = pytest.mark.proxy

SOLO = "solo-model-260101"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
          prefix: str) -> Iterator[Proxy]:
    """One proxy for the module; the solo pool (guarded, acct-c) has plenty of headroom."""
    p = start_proxy(tmp_path_factory.mktemp("proxy"), fake, store_url, prefix)
    yield p
    stop_proxy(p)


@pytest.fixture(autouse=True)
def _fresh(proxy: Proxy) -> None:
    """Every test starts with a roomy pool and empty upstream logs."""
    proxy.fake.clear_chat_requests()
    proxy.seed(POOL_SOLO, 1_000_000)


def upstream(proxy: Proxy, path: str) -> list[UpstreamRequest]:
    return [r for r in proxy.fake.upstream_requests() if r.path == path]


def only_body(proxy: Proxy, path: str) -> dict[str, Any]:
    (request,) = upstream(proxy, path)
    assert request.method == "POST"
    assert isinstance(request.body, dict)
    return request.body


def test_responses_reach_ark_natively_and_a_chain_is_billed_as_input(proxy: Proxy) -> None:
    """/v1/responses goes to POST /api/v3/responses; a previous_response_id follow-up is billed
    the stored turn again, and both come back with Responses usage."""
    client = proxy.client()
    first = client.responses.create(
        model="solo", input="[[fake prompt=2000 completion=100 reasoning=300]] hi",
        instructions="be brief", max_output_tokens=1000,
        extra_headers={"x-litellm-call-id": call_id()})
    assert first.usage is not None and first.usage.input_tokens == 2000
    assert first.usage.output_tokens == 400
    body = only_body(proxy, "/api/v3/responses")
    assert body["model"] == SOLO and body["instructions"] == "be brief"
    assert "[[fake prompt=2000" in str(body["input"])
    assert body["max_output_tokens"] <= 1000
    (turn,) = proxy.fake.chat_requests()
    assert turn.response_id is not None and turn.response_id != first.id  # LiteLLM re-encodes ids

    proxy.fake.clear_chat_requests()
    second = client.responses.create(
        model="solo", input="[[fake prompt=50 completion=10 reasoning=0]] more",
        previous_response_id=first.id, extra_headers={"x-litellm-call-id": call_id()})
    assert second.usage is not None and second.usage.input_tokens == 2400 + 50
    assert only_body(proxy, "/api/v3/responses")["previous_response_id"] == turn.response_id
    (record,) = proxy.fake.chat_requests()
    assert (record.endpoint, record.chain_tokens, record.consumed) == ("responses", 2400, 2460)


def test_a_streamed_response_comes_back_with_usage(proxy: Proxy) -> None:
    """A streaming /v1/responses reaches the fake with stream=true; response.completed has usage."""
    events = list(proxy.client().responses.create(
        model="solo", input="[[fake prompt=30 completion=12 reasoning=5]]", stream=True,
        extra_headers={"x-litellm-call-id": call_id()}))
    completed = [e for e in events if e.type == "response.completed"]
    assert completed, [e.type for e in events]
    usage = completed[-1].response.usage  # type: ignore[union-attr]
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (30, 17)
    assert only_body(proxy, "/api/v3/responses")["stream"] is True
    assert proxy.fake.chat_requests()[0].consumed == 47


def test_embeddings_reach_ark_with_a_list_input_and_report_usage(proxy: Proxy) -> None:
    """/v1/embeddings goes to POST /api/v3/embeddings with input as a list; usage comes back."""
    got = proxy.client().embeddings.create(
        model="solo", input="[[fake prompt=321]] text",
        extra_headers={"x-litellm-call-id": call_id()})
    assert got.usage.prompt_tokens == 321
    body = only_body(proxy, "/api/v3/embeddings")
    assert body["model"] == SOLO and body["input"] == ["[[fake prompt=321]] text"]
    assert proxy.fake.pool_totals(POOL_SOLO).consumed >= 321


def test_chat_extra_body_is_merged_into_the_upstream_json(proxy: Proxy) -> None:
    """Top-level extras (thinking, unknown flags) reach the chat body the fake reads, with one
    output cap at most what the client asked (LiteLLM renames max_completion_tokens to
    max_tokens; the fake refuses both together)."""
    client = proxy.client()
    r = client.chat.completions.create(
        model="solo", max_completion_tokens=700,
        messages=[{"role": "user", "content": "[[fake prompt=10 completion=20 reasoning=30]]"}],
        extra_body={"thinking": {"type": "disabled"}, "some_flag": 1},
        extra_headers={"x-litellm-call-id": call_id()})
    assert r.usage is not None and r.usage.completion_tokens == 20  # thinking off
    body = only_body(proxy, "/api/v3/chat/completions")
    assert body["thinking"] == {"type": "disabled"} and body["some_flag"] == 1
    caps = [body[k] for k in ("max_tokens", "max_completion_tokens") if k in body]
    assert len(caps) == 1 and caps[0] <= 700, body


def test_a_literal_extra_body_overrides_the_billed_fields_upstream(proxy: Proxy) -> None:
    """A JSON `extra_body` key sent to the proxy is merged over the upstream body: it replaces
    chat messages, embeddings input and Responses input — the fields the fake bills."""
    client = proxy.client()
    client.chat.completions.create(
        model="solo", messages=[{"role": "user", "content": "hi"}],
        extra_body={"extra_body": {"messages": [{"role": "user", "content": "[[fake prompt=900]]"}],
                                   "n": 2}},
        extra_headers={"x-litellm-call-id": call_id()})
    client.embeddings.create(model="solo", input="hi",
                             extra_body={"extra_body": {"input": ["[[fake prompt=800]]"]}},
                             extra_headers={"x-litellm-call-id": call_id()})
    client.responses.create(model="solo", input="hi",
                            extra_body={"extra_body": {"input": "[[fake prompt=700]]"}},
                            extra_headers={"x-litellm-call-id": call_id()})
    chat = only_body(proxy, "/api/v3/chat/completions")
    assert chat["messages"][0]["content"] == "[[fake prompt=900]]" and chat["n"] == 2
    assert only_body(proxy, "/api/v3/embeddings")["input"] == ["[[fake prompt=800]]"]
    assert only_body(proxy, "/api/v3/responses")["input"] == "[[fake prompt=700]]"
    # n: 2 reads the prompt twice (the dearer reading of Ark's undocumented `n`)
    assert [r.prompt_tokens for r in proxy.fake.chat_requests()] == [2 * 900, 800, 700]


def test_a_background_response_is_refused_naming_the_field(proxy: Proxy) -> None:
    """`background: true` makes Ark finish the run after the request returns: its usage arrives
    when the guard no longer watches (past a package expiry, past midnight). A 400 naming it,
    also when it comes in through extra_body; nothing reaches Ark."""
    client = proxy.client()
    # (a top-level `background` LiteLLM itself refuses for Volcengine; extra_body reaches Ark)
    with pytest.raises(openai.BadRequestError, match="background: a run Ark finishes"):
        client.responses.create(model="solo", input="hi",
                                extra_body={"extra_body": {"background": True}},
                                extra_headers={"x-litellm-call-id": call_id()})
    assert upstream(proxy, "/api/v3/responses") == []
    client.responses.create(model="solo", input="hi",
                            extra_body={"extra_body": {"background": False}},
                            extra_headers={"x-litellm-call-id": call_id()})
    assert len(upstream(proxy, "/api/v3/responses")) == 1


def test_a_field_in_another_case_is_refused_before_ark(proxy: Proxy) -> None:
    """LiteLLM passes `extra_body` keys through as written; Ark's decoder may match names
    regardless of case (`N: 16` as n), so a field in another case is a 400 naming it."""
    client = proxy.client()
    with pytest.raises(openai.BadRequestError, match="'n'"):
        client.chat.completions.create(model="solo", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"N": 16},
                                       extra_headers={"x-litellm-call-id": call_id()})
    with pytest.raises(openai.BadRequestError, match="'max_output_tokens'"):
        client.responses.create(model="solo", input="hi",
                                extra_body={"extra_body": {"Max_Output_Tokens": 60_000}},
                                extra_headers={"x-litellm-call-id": call_id()})
    assert upstream(proxy, "/api/v3/chat/completions") == upstream(proxy, "/api/v3/responses") == []
