"""Doubao (ark-api) deployments near the wall: counted exactly by Ark's tokenization API.

A real proxy with the sync on, in front of the fake Ark, whose one hidden Doubao tokenizer bills
the prompts and answers POST /api/v3/tokenization, and whose bill adds a chat template (5 per
message) and a drift (+4%) the guard is not told. Each test has its own pool (SMALL_BUFFER
1,000); the free tokens are chosen so that the cheap count (cl100k × 1.7, held to 3.0 in the
miscount risk) does not fit the wall but the exact count (Ark's count + 8 per message, × 1.1,
held to 1.5) does.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from proxy_support import Proxy, ark_deployment, call_id, start_syncing_proxy, stop_proxy

from volc_quota_guard import counting
from volc_quota_guard.fake import FakeVolcengine
from volc_quota_guard.fake.ark_api import doubao_control
from volc_quota_guard.fake.tokenize_api import tokenize_control

pytestmark = pytest.mark.proxy
BUFFER = 1_000
ZH = "请把免费额度的规则总结成三条要点，并说明什么时候开始计费、怎样避免超额。"
POOLS = {  # model name -> (pool, free tokens: the wall's headroom + SMALL_BUFFER)
    "db-long": ("acct-c/doubao-long-260101", BUFFER + 2_000),  # exact needs 1,186, cheap 4,045
    "db-chat": ("acct-c/doubao-chat-260101", BUFFER + 700),  # exact needs 517, cheap 870
    "db-fault": ("acct-c/doubao-fault-260101", BUFFER + 2_000),
    "db-cache": ("acct-c/doubao-cache-260101", BUFFER + 3_000),
    "db-learn": ("acct-c/doubao-learn-260101", BUFFER + 700),  # exact needs 460, cheap 906
    "db-big": ("acct-c/doubao-big-260101", BUFFER + 500_000),  # far from the wall
    "db-runs": ("acct-c/doubao-runs-260101", BUFFER + 60_000),  # CRLF runs: chat + embeddings
}
NO_THINKING = {"thinking": {"type": "disabled"}}


def long_chat(tag: str = "", directive: str = "") -> list[dict[str, Any]]:
    """One long Chinese message: the 10% floor is what covers the hidden +4% drift here."""
    return [{"role": "user", "content": ZH * 40 + tag + directive}]


def short_turns(directive: str = "") -> list[dict[str, Any]]:
    """Ten short messages: the per-message template allowance is what covers the fake's here."""
    msgs = [{"role": "system", "content": "你是一个助手。"}]
    for i in range(4):
        msgs += [{"role": "user", "content": f"第{i}个问题：额度还剩多少？"},
                 {"role": "assistant", "content": f"还剩很多，第{i}次。"}]
    return [*msgs, {"role": "user", "content": ZH * 6 + directive}]


@pytest.fixture(scope="module")
def doubao(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
           prefix: str) -> Iterator[Proxy]:
    deployments = [ark_deployment(name, pool) for name, (pool, _) in POOLS.items()]
    deployments.append(ark_deployment("db-runs-embed", POOLS["db-runs"][0], mode="embedding"))
    p = start_syncing_proxy(tmp_path_factory.mktemp("doubao"), fake, store_url, prefix,
                            dict(POOLS.values()), deployments,
                            VQG_SMALL_BUFFER=str(BUFFER), VQG_EVICT_BELOW="100")
    yield p
    stop_proxy(p)


def ask(proxy: Proxy, model: str, messages: list[dict[str, Any]]) -> Any:
    return proxy.client().chat.completions.create(
        model=model, max_tokens=200, messages=messages,  # type: ignore[arg-type]
        extra_body=NO_THINKING, extra_headers={"x-litellm-call-id": call_id()})


def held_while_running(proxy: Proxy, model: str, messages: list[dict[str, Any]]) -> dict[str, int]:
    """The pool's in-flight sums while the request runs (its directive makes the fake wait)."""
    pool = POOLS[model][0]
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(ask(proxy, model, messages)))
    worker.start()
    held: dict[str, int] = {}
    deadline = time.monotonic() + 20
    while not held and time.monotonic() < deadline:
        st = proxy.state(pool)
        if st.get("inflight"):
            held = {k: st.get(k) for k in ("inflight", "inflight_est", "inflight_xest",
                                           "inflight_xest_res")}
        time.sleep(0.02)
    worker.join(30)
    assert done and held, (done, held)
    return held


def settled(proxy: Proxy, model: str) -> None:
    deadline = time.monotonic() + 20
    while proxy.state(POOLS[model][0]).get("inflight") and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize(("model", "build"), [("db-long", long_chat), ("db-chat", short_turns)])
def test_a_request_the_cheap_count_refuses_is_admitted_at_its_exact_count_and_bills_0(
        doubao: Proxy, model: str, build: Any) -> None:
    """Near the wall, cl100k × 1.7 (and its 3.0 miscount hold) does not fit; Ark's count + 8 per
    message × 1.1 does, and covers what the fake bills: the drift on a long message (a guard
    without the floor under-holds it), the template on ten short ones (one without the
    per-message allowance does)."""
    pool, _ = POOLS[model]
    messages = build(directive=" [[fake delay=1.0]]")
    texts = [m["content"] for m in messages]
    exact = sum(counting.deepseek_tokens(t) for t in texts) + counting.ARK_API_MESSAGE_TOKENS * len(messages)
    calls = tokenize_control(doubao.fake).calls
    held = held_while_running(doubao, model, messages)
    assert tokenize_control(doubao.fake).calls == calls + 1  # asked once, after the cheap refusal
    assert held["inflight_est"] == 0 and held["inflight_xest"] == exact
    assert held["inflight_xest_res"] == -(-exact * 11 // 10)
    assert held["inflight"] == held["inflight_xest_res"] + 200
    record = doubao.fake.chat_requests()[-1]
    assert record.pool == pool
    assert exact - 8 * len(messages) < record.prompt_tokens <= held["inflight_xest_res"]
    assert counting.cl100k_chat(messages, None) * 17 // 10 > held["inflight_xest_res"] * 2  # the gain
    settled(doubao, model)
    assert doubao.fake.pool_totals(pool).billed == 0
    doubao.wait_for_log(rf"\[EXACT\] doubao-{model[3:]}-260101: input \d+ \(cheap\) -> {exact} ")


def test_a_big_prompt_is_counted_exactly_far_from_the_wall(doubao: Proxy) -> None:
    """A prompt the cheap count puts at VQG_EXACT_COUNT_MIN_TOKENS (2,000) or more is counted by
    Ark's tokenization API before its first reserve, wherever the wall is: near a wall its
    cheap count's 3.0 miscount hold would crowd out others. A smaller one stays cheap."""
    control = tokenize_control(doubao.fake)
    big = [{"role": "user", "content": ZH * 80 + " [[fake delay=1.0]]"}]
    assert counting.cl100k_chat(big, None) >= 2_000
    calls = control.calls
    held = held_while_running(doubao, "db-big", big)
    assert control.calls == calls + 1
    assert held["inflight_est"] == 0 and held["inflight_xest"] > 0
    settled(doubao, "db-big")
    small = short_turns(directive=" [[fake delay=1.0]]")
    held = held_while_running(doubao, "db-big", small)
    assert control.calls == calls + 1  # not asked: the cheap count fits and is small
    assert held["inflight_est"] == counting.cl100k_chat(small, None) and held["inflight_xest"] == 0
    settled(doubao, "db-big")
    assert doubao.fake.pool_totals(POOLS["db-big"][0]).billed == 0


def test_every_tokenization_fault_falls_back_to_the_cheap_count_and_bills_0(doubao: Proxy) -> None:
    """A 500, a hang past the 0.3 s timeout, a body that is not JSON, JSON without counts, a 401
    and a count of 0 for a long text: each falls back to cl100k × k, which does not fit, so the
    request is refused (429) and nothing reaches the chat endpoint; the fallback is logged once
    for the deployment, not per request. Once the API answers again, the same request is
    admitted at its exact count."""
    control = tokenize_control(doubao.fake)
    pool, _ = POOLS["db-fault"]
    chats = len(doubao.fake.chat_requests())
    try:
        for mode in ("error", "hang", "garbage", "wrong", "denied", "zero"):
            control.mode, control.hang_s = mode, 2.0  # type: ignore[assignment]
            calls = control.calls
            with pytest.raises(openai.RateLimitError):
                ask(doubao, "db-fault", long_chat(f" {mode}"))
            assert control.calls == calls + 1, mode  # asked, failed, not cached
    finally:
        control.mode = "ok"
    assert len(doubao.fake.chat_requests()) == chats
    assert len(doubao.wait_for_log(r"\[EXACT-FALLBACK\] doubao-fault-260101")) == 1
    assert ask(doubao, "db-fault", long_chat(" error")).usage is not None
    settled(doubao, "db-fault")
    assert doubao.fake.pool_totals(pool).billed == 0
    assert doubao.fake.pool_totals(pool).consumed > 0


def test_a_repeated_prompt_is_counted_from_the_cache(doubao: Proxy) -> None:
    """The same prompt twice near the wall: Ark's tokenization API is asked once."""
    control = tokenize_control(doubao.fake)
    calls = control.calls
    for _ in range(2):
        assert ask(doubao, "db-cache", long_chat(" cache")).usage is not None
        settled(doubao, "db-cache")
    assert control.calls == calls + 1
    assert len(doubao.wait_for_log(r"\[EXACT\] doubao-cache-260101", count=2)) == 2
    assert doubao.fake.pool_totals(POOLS["db-cache"][0]).billed == 0


def test_the_exact_correction_learns_a_template_bigger_than_the_allowance(doubao: Proxy) -> None:
    """With the fake's hidden template raised to 200 tokens a message, the measured prompt is
    ~1.86x the exact count: the pool's exact correction (kx) learns it, the cheap k does not
    move, and the next exact count is held at the learned factor."""
    control = doubao_control(doubao.fake)
    pool, _ = POOLS["db-learn"]
    messages = [{"role": "user", "content": ZH * 10}]
    exact = counting.deepseek_tokens(ZH * 10) + counting.ARK_API_MESSAGE_TOKENS
    control.template_tokens = 200
    try:
        r = ask(doubao, "db-learn", messages)
    finally:
        control.template_tokens = 5
    settled(doubao, "db-learn")
    measured = r.usage.prompt_tokens
    assert measured > exact * 1.5
    st = doubao.state(pool)
    assert st.get("xcorr_n") == 1 and st.get("corr_n") == 0
    assert st.get("xcorr") == -(-measured * 1_000_000 // exact)
    assert st.get("corr") == 0
    assert doubao.fake.pool_totals(pool).billed == 0


def test_after_a_tokenization_failure_big_prompts_stop_asking_first(doubao: Proxy) -> None:
    """With Ark's tokenization API failing, a big prompt far from the wall falls back to its cheap
    count (and is admitted, it fits); for EXACT_BACKOFF_S the next big prompts of that deployment
    do not ask first (each would wait for the API's timeout for nothing)."""
    control = tokenize_control(doubao.fake)
    big = [{"role": "user", "content": ZH * 80 + " backoff [[fake delay=1.0]]"}]
    try:
        control.mode = "error"  # type: ignore[assignment]
        calls = control.calls
        held = held_while_running(doubao, "db-big", big)
        assert control.calls == calls + 1 and held["inflight_xest"] == 0  # asked, fell back
        settled(doubao, "db-big")
        other = [{"role": "user", "content": ZH * 81 + " [[fake delay=1.0]]"}]
        held = held_while_running(doubao, "db-big", other)
        assert control.calls == calls + 1 and held["inflight_est"] > 2_000  # not asked again
        settled(doubao, "db-big")
    finally:
        control.mode = "ok"
    assert doubao.fake.pool_totals(POOLS["db-big"][0]).billed == 0


@pytest.mark.parametrize("route", ["chat", "embeddings"])
def test_a_run_cl100k_merges_is_weighed_counted_by_ark_and_covered(doubao: Proxy, route: str) -> None:
    """CRLF x5,000 is 1,250 cl100k tokens and 10,000 Doubao ones (the fake's hidden tokenizer):
    weighed token by token the cheap count is 10,000, over VQG_EXACT_COUNT_MIN_TOKENS, so Ark's
    tokenization API is asked and the reservation covers what Ark bills. Before, the guard
    reserved 2,404 for a chat that consumed 10,422 (and 2,975 for embeddings that consumed 14,560)."""
    pool, _ = POOLS["db-runs"]
    control = tokenize_control(doubao.fake)
    calls, before, cid = control.calls, len(doubao.fake.chat_requests()), call_id()
    text = "\r\n" * 5_000 + f" {route}"
    if route == "chat":
        doubao.client().chat.completions.create(
            model="db-runs", max_tokens=200, messages=[{"role": "user", "content": text}],
            extra_body=NO_THINKING, extra_headers={"x-litellm-call-id": cid})
    else:
        doubao.client().embeddings.create(model="db-runs-embed", input=[text, text],
                                          extra_headers={"x-litellm-call-id": cid})
    assert control.calls == calls + 1  # asked: the weighed cheap count is a big prompt
    [record] = doubao.fake.chat_requests()[before:]
    assert record.consumed > 10_000 * (2 if route == "embeddings" else 1)
    [line] = doubao.wait_for_log(rf"\[Usage\].*call={cid}\b")
    assert int(re.search(r"reserved=(\d+)", line).group(1)) >= record.consumed  # type: ignore[union-attr]
    settled(doubao, "db-runs")
    assert doubao.fake.pool_totals(pool).billed == 0
