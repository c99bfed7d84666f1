"""Text the template may drop still reaches Ark as sent: it is reserved, and the fake bills it.

Found by a red-team pass (stop 35). On DeepSeek pools a tool call's `arguments` were sized after
`json.loads` and re-rendering, so JSON whitespace, `\\uXXXX` escapes and a duplicate key (the last
one wins: the text before it vanished) were never reserved, and the fake, billing with the same
renderer, could not see it: 75,006 tokens of arguments held 128. A tool call's `id` and a tool's
keys beside `function` were dropped the same way. And the fake billed a `refusal` part's text as
empty (it carries it under `refusal`): 22,107 tokens of text billed 24 — an oracle kinder than Ark.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from call_outcome import send
from proxy_support import Proxy, ark_deployment, start_syncing_proxy, stop_proxy

from volc_quota_guard import counting
from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy
DS = ("acct-c/deepseek-rtargs-260101", 5_000_000)
PLAIN = ("acct-c/rt-refusal-260101", 5_000_000)
PADDED = '{"a": 1' + " \n\t\r" * 25_000 + "}"            # valid JSON: loads to {"a": 1}
ESCAPED = json.dumps({"a": "中文字符" * 5_000})            # ensure_ascii: 6 chars per CJK char
DUPLICATE = '{"a": "' + "hello world " * 20_000 + '", "a": 1}'  # loads to {"a": 1}
BIG = "hello world " * 10_000
REFUSAL = "I will not do that because of a long explanation. " * 2_000


@pytest.fixture(scope="module")
def px(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
       prefix: str) -> Iterator[Proxy]:
    p = start_syncing_proxy(tmp_path_factory.mktemp("unrendered"), fake, store_url, prefix,
                            dict([DS, PLAIN]), [ark_deployment("rt-ds", DS[0]),
                                                ark_deployment("rt-refusal", PLAIN[0])])
    yield p
    stop_proxy(p)


def body(arguments: str) -> dict:
    return {"model": "rt-ds", "max_tokens": 10, "thinking": {"type": "disabled"},
            "messages": [{"role": "user", "content": "go"},
                         {"role": "assistant", "content": "",
                          "tool_calls": [{"id": "c1", "type": "function",
                                          "function": {"name": "f", "arguments": arguments}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                         {"role": "user", "content": "done? [[fake completion=5]]"}]}


@pytest.mark.parametrize("arguments", [PADDED, ESCAPED, DUPLICATE],
                         ids=["json-whitespace", "json-escapes", "duplicate-key"])
def test_deepseek_tool_call_arguments_are_reserved_and_billed_as_sent(px: Proxy, arguments: str) -> None:
    raw = counting.deepseek_tokens(arguments)  # the string Ark receives, tokenized as it is
    o = send(px, "/v1/chat/completions", body(arguments))
    assert o.code == 200, o
    assert o.upstream[-1].body["messages"][1]["tool_calls"][0]["function"]["arguments"] == arguments
    assert o.consumed >= raw, f"the fake billed {o.consumed} for {raw} tokens of arguments"
    assert o.held >= o.consumed, f"reserved {o.held}, billed {o.consumed}"


@pytest.mark.parametrize("where", ["tool_call_id", "tool_extra_key"])
def test_deepseek_fields_the_template_drops_are_reserved_and_billed(px: Proxy, where: str) -> None:
    b = body("{}")
    if where == "tool_call_id":
        b["messages"][1]["tool_calls"][0]["id"] = BIG
    else:
        b["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {}}, "note": BIG}]
    o = send(px, "/v1/chat/completions", b)
    raw = counting.deepseek_tokens(BIG)
    assert o.code == 200, o
    assert o.consumed >= raw, f"the fake billed {o.consumed} for {raw} tokens of {where}"
    assert o.held >= o.consumed, f"reserved {o.held}, billed {o.consumed}"


@pytest.mark.parametrize(("path", "request_body"), [
    ("/v1/chat/completions", {"max_tokens": 10, "thinking": {"type": "disabled"}, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": REFUSAL}]},
        {"role": "user", "content": "again [[fake completion=5]]"}]}),
    ("/v1/responses", {"max_output_tokens": 16, "reasoning": {"effort": "minimal"}, "input": [
        {"role": "user", "content": "go"},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": REFUSAL}]},
        {"role": "user", "content": "again [[fake completion=5]]"}]}),
], ids=["chat", "responses"])
def test_the_fake_bills_a_refusal_parts_text(px: Proxy, path: str, request_body: dict) -> None:
    text = counting.cl100k_tokens(REFUSAL)
    o = send(px, path, {"model": "rt-refusal", **request_body})
    assert o.code == 200, o
    assert o.records[-1].prompt_tokens >= text, o
    assert o.held >= o.consumed, f"reserved {o.held}, billed {o.consumed}"
