"""Issue 13's request shapes through a real proxy, with the sync on, against the faithful fake Ark.

Each shape has its own small pool (60,000 free, SMALL_BUFFER 10,000; 200,000 for the thinking
flood) and the same client code a user would write. The fake bills as ARK.md says (reasoning
beyond max_tokens, n, extra_body merged, stored responses, the image formula), so any
under-reservation shows as billed tokens on its ledger.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from proxy_support import MASTER_KEY, Proxy, ark_deployment, call_id, start_syncing_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy
SHAPES = {  # model name -> (pool, free tokens)
    "think": ("acct-c/think-model-260101", 200_000),
    "small": ("acct-c/small-model-260101", 60_000),
    "embed": ("acct-c/embed-model-260101", 60_000),
    "resp": ("acct-c/resp-model-260101", 150_000),  # a 22k prompt is held at 3x (the ceiling)
    "media": ("acct-c/media-model-260101", 60_000),
    # a conversation stored through one model, continued through another (declaring 5,000)
    "ctx-a": ("acct-c/ctxa-model-260101", 200_000),
    "ctx-b": ("acct-c/ctxb-model-260101", 25_000),
}
INFO = {"embed": {"mode": "embedding"}, "ctx-b": {"max_input_tokens": 5_000}}


@pytest.fixture(scope="module")
def shaped(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
           prefix: str) -> Iterator[Proxy]:
    """A syncing proxy whose only source of truth is the fake's ListResourcePackages."""
    deployments = [ark_deployment(name, pool, **INFO.get(name, {})) for name, (pool, _) in SHAPES.items()]
    p = start_syncing_proxy(tmp_path_factory.mktemp("shapes"), fake, store_url, prefix,
                            dict(SHAPES.values()), deployments,
                            VQG_SMALL_BUFFER="10000", VQG_EVICT_BELOW="1000")
    yield p
    stop_proxy(p)


def billed(proxy: Proxy, name: str) -> int:
    return proxy.fake.pool_totals(SHAPES[name][0]).billed


def settled(proxy: Proxy, name: str) -> None:
    """Nothing of the pool is left in flight (every route settles or releases)."""
    deadline = time.monotonic() + 20
    while proxy.state(SHAPES[name][0]).get("inflight") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proxy.state(SHAPES[name][0]).get("inflight") == 0


def post(proxy: Proxy, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{proxy.url}{path}", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": call_id()})


def test_a_thinking_flood_bills_nothing_and_serves_most_of_the_free_quota(shaped: Proxy) -> None:
    """max_tokens 1,000 with ~6,000 reasoning tokens, 12 at a time: reserved with the reasoning
    allowance and capped upstream at that sum, the pool serves until the wall and bills 0."""
    client = shaped.client()

    def one(_: int) -> int:
        try:
            r = client.chat.completions.create(
                model="think", max_tokens=1_000, extra_headers={"x-litellm-call-id": call_id()},
                messages=[{"role": "user", "content": "think hard [[fake completion=1000 reasoning=6000]]"}])
            return r.usage.total_tokens if r.usage else 0
        except openai.RateLimitError:
            return -1

    served = 0
    with ThreadPoolExecutor(12) as pool:
        for _ in range(6):
            results = list(pool.map(one, range(12)))
            served += sum(r for r in results if r > 0)
            if results.count(-1) == 12:
                break
    settled(shaped, "think")
    assert billed(shaped, "think") == 0
    assert served >= 0.7 * (200_000 - 10_000), served  # most of the free quota was served


def test_n_choices_are_reserved_each_and_a_large_n_is_a_400(shaped: Proxy) -> None:
    """n multiplies the output reserved; n above the bound is refused naming `n`."""
    client = shaped.client()
    with pytest.raises(openai.BadRequestError, match="n must be"):
        client.chat.completions.create(model="small", n=40, max_tokens=2_000,
                                       messages=[{"role": "user", "content": "hi"}])
    for _ in range(6):
        try:
            client.chat.completions.create(
                model="small", n=4, max_tokens=2_000, extra_headers={"x-litellm-call-id": call_id()},
                messages=[{"role": "user", "content": "hi [[fake completion=2000 reasoning=500]]"}])
        except openai.RateLimitError:
            break
    settled(shaped, "small")
    assert billed(shaped, "small") == 0


def test_extra_body_messages_are_what_is_reserved(shaped: Proxy) -> None:
    """A tiny `messages` with 90k tokens in `extra_body.messages` is sized by the latter: refused."""
    r = post(shaped, "/v1/chat/completions", {
        "model": "small", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}],
        "extra_body": {"messages": [{"role": "user", "content": "hello " * 90_000}]}})
    assert r.status_code == 429, r.text
    settled(shaped, "small")
    assert billed(shaped, "small") == 0


def test_embedding_input_in_extra_body_is_reserved(shaped: Proxy) -> None:
    """An embedding's `extra_body.input` (90k tokens) is what is reserved: refused, nothing billed;
    a plain embedding is served and settled."""
    r = post(shaped, "/v1/embeddings", {"model": "embed", "input": "hi",
                                        "extra_body": {"input": "token " * 90_000}})
    assert r.status_code == 429, r.text
    ok = post(shaped, "/v1/embeddings", {"model": "embed", "input": "a short text to embed"})
    assert ok.status_code == 200, ok.text
    settled(shaped, "embed")
    assert billed(shaped, "embed") == 0


def test_response_follow_ups_reserve_the_stored_chain(shaped: Proxy) -> None:
    """After a 22k-token first turn, each `previous_response_id` follow-up reserves the stored
    conversation it makes Ark re-read: the pool stops before billing."""
    first = post(shaped, "/v1/responses", {"model": "resp", "input": "word " * 22_000,
                                           "max_output_tokens": 200})
    assert first.status_code == 200, first.text
    prev = first.json()["id"]
    codes = []
    for _ in range(4):
        r = post(shaped, "/v1/responses", {"model": "resp", "input": "and then?",
                                           "previous_response_id": prev, "max_output_tokens": 200})
        codes.append(r.status_code)
        if r.status_code != 200:
            break
        prev = r.json()["id"]
    assert codes[-1] == 429 and set(codes) <= {200, 429}, codes
    settled(shaped, "resp")
    assert billed(shaped, "resp") == 0


def test_a_follow_up_through_another_model_reserves_the_stored_chain(shaped: Proxy) -> None:
    """The guard's record of a stored conversation is not per pool: continued through another
    model (same account), whose declared window is smaller, it is still reserved whole (a
    60,100-token conversation billed 60,155 against 8,576 reserved, red-team stop 38)."""
    first = post(shaped, "/v1/responses", {"model": "ctx-a", "input": "word " * 20_000,
                                           "max_output_tokens": 200})
    assert first.status_code == 200, first.text
    r = post(shaped, "/v1/responses", {"model": "ctx-b", "input": "and then?",
                                       "previous_response_id": first.json()["id"],
                                       "max_output_tokens": 200})
    assert r.status_code == 429, r.text  # 20,000+ re-read does not fit 25,000 less the buffer
    settled(shaped, "ctx-b")
    assert billed(shaped, "ctx-b") == 0


def test_a_comma_fan_out_to_a_guarded_model_is_refused(shaped: Proxy) -> None:
    """`model: "small,small,…"` would make several upstream calls for one reservation: a 400."""
    before = len(shaped.fake.chat_requests())
    r = post(shaped, "/v1/chat/completions", {"model": ",".join(["small"] * 20), "max_tokens": 100,
                                              "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "several models" in r.text, r.text
    assert len(shaped.fake.chat_requests()) == before


def test_a_video_part_is_refused_unless_the_deployment_bounds_it(shaped: Proxy) -> None:
    """A `video_url` part Ark bills by its unseen content is a 400 naming the part."""
    r = post(shaped, "/v1/chat/completions", {"model": "media", "max_tokens": 100, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "what happens?"},
                                     {"type": "video_url", "video_url": {"url": "https://x.invalid/v.mp4"}}]}]})
    assert r.status_code == 400 and "video_url" in r.text, r.text
    settled(shaped, "media")
    assert billed(shaped, "media") == 0


@pytest.mark.parametrize("path", ["/v1beta/models/small:generateContent",
                                  "/v1beta/models/small:streamGenerateContent"])
def test_routes_the_guard_cannot_settle_are_refused_and_leave_nothing_in_flight(
        shaped: Proxy, path: str) -> None:
    """generateContent on a guarded model is a 4xx, and no reservation waits for its TTL."""
    r = post(shaped, path, {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    assert 400 <= r.status_code < 500, r.text
    settled(shaped, "small")


def test_no_guard_error_reached_a_client_as_a_500(shaped: Proxy) -> None:
    """Every shape above got a clear answer: the guard logged no internal error."""
    log = shaped.log()
    assert "guard error, request refused" not in log and "pre-call check failed" not in log


def test_anthropic_messages_with_n_are_sized_per_choice(shaped: Proxy) -> None:
    """/v1/messages passes `n` on to the chat call: it is reserved per choice (here too much for
    the pool: 429) and bounded (40 is a 400), and nothing is billed."""
    body = {"model": "small", "max_tokens": 1_000, "n": 16,
            "messages": [{"role": "user", "content": "hi [[fake completion=1000 reasoning=5000]]"}]}
    assert post(shaped, "/v1/messages", body).status_code == 429
    r = post(shaped, "/v1/messages", body | {"n": 1, "extra_body": {"n": 40}})
    assert r.status_code == 400, r.text
    settled(shaped, "small")
    assert billed(shaped, "small") == 0
