"""Fuzz of request *shapes* through a real proxy against the faithful fake Ark (issue 13's class).

Hypothesis draws bodies a client could send — `extra_body` overrides, `n`, thinking switches,
every cap field (good and bad), streams, images and video parts, Responses chains, embeddings,
comma fan-outs, text cl100k merges and others split, thousands of empty text parts, a long
message key, a text part's keys beside its text, NaN / Infinity, Responses items that are not
messages, `background` runs — one at a time. For
each, Ark's ledger must show at most what the guard reserved for that call (the `reserved=` of
its Usage line; nothing at all when the guard refused), and no answer may be a 5xx. Four pools
take the traffic: a large one, and three small ones that reach their walls (a model of unknown
tokenizer, a Doubao one, a DeepSeek one), where the fake's `billed` must stay 0.
`VQG_SHAPE_FUZZ_EXAMPLES` sets the number of bodies (default 300; CI runs the default).
"""

from __future__ import annotations

import base64
import json
import os
import re
import struct
import time
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proxy_support import MASTER_KEY, Proxy, ark_deployment, call_id, start_syncing_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy
EXAMPLES = int(os.environ.get("VQG_SHAPE_FUZZ_EXAMPLES", "300"))
POOLS = {"fz-big": ("acct-c/fz-big-260101", 20_000_000), "fz-small": ("acct-c/fz-small-260101", 150_000),
         # each family's own counting: Ark's tokenization API (Doubao), the offline V4 (DeepSeek)
         "fz-doubao": ("acct-c/doubao-fz-260101", 150_000), "fz-ds": ("acct-c/deepseek-fz-260101", 150_000)}
RESERVED = re.compile(r"reserved=(\d+)")


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
           prefix: str) -> Iterator[Proxy]:
    """A syncing proxy in front of the fake, four pools (three small enough to reach their walls)."""
    info = {"max_input_tokens": 131_072}  # sizes unknown response chains
    deployments = [d for name, (pool, _) in POOLS.items() for d in (
        ark_deployment(name, pool, **info),
        ark_deployment(f"{name}-embed", pool, mode="embedding", **info))]
    p = start_syncing_proxy(tmp_path_factory.mktemp("shape-fuzz"), fake, store_url, prefix,
                            dict(POOLS.values()), deployments,
                            VQG_SMALL_BUFFER="10000", VQG_EVICT_BELOW="500")
    yield p
    stop_proxy(p)


def png(width: int, height: int) -> str:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(
        ">I", zlib.crc32(b"IHDR" + ihdr))
    return "data:image/png;base64," + base64.b64encode(body).decode()


# Ordinary text, and text cl100k merges far more than other tokenizers do (runs of a short unit,
# invisible characters): CRLF x3,000 is 750 cl100k tokens and 6,000 of the fake's Doubao.
texts = st.sampled_from(["hi", "火山方舟免费额度", "word " * 300, "长文本" * 700, "code(x) {} " * 200,
                         "\r\n" * 3_000, "%" * 1_500, "\u200b" * 1_200, "\t\n" * 1_500,
                         "ABCDEFGHIJKLMNOPQRSTUVWXYZ" * 600])
directives = st.builds(
    lambda c, r, m: f" [[fake completion={c} reasoning={r}{' usage=missing' if m else ''}]]",
    st.integers(0, 8_000), st.integers(0, 30_000), st.booleans())
images = st.builds(lambda w, h, d, remote: {"type": "image_url", "image_url": {
    "url": "https://img.invalid/a.png" if remote else png(w, h), **({"detail": d} if d else {})}},
    st.integers(1, 5_000), st.integers(1, 5_000), st.sampled_from([None, "low", "high", "auto"]),
    st.booleans())
video = st.just({"type": "video_url", "video_url": {"url": "https://v.invalid/v.mp4"}})
thinking = st.sampled_from([None, {"type": "enabled"}, {"type": "disabled"}, {"type": "auto"}])
caps = st.one_of(st.none(), st.integers(1, 9_000))
small_n = st.one_of(st.none(), st.integers(1, 4))
# One body in two carries one field the guard must refuse (a 400 naming it).
faults = st.sampled_from([None] * 11 + [("max_tokens", 0), ("max_completion_tokens", "100"),
                                       ("max_tokens", 10**9), ("n", 40), ("n", 0), ("video", None),
                                       ("additional_drop_params", ["max_completion_tokens"]),
                                       # fields LiteLLM turns into messages after the hook
                                       ("ensure_alternating_roles", True),
                                       ("assistant_continue_message", {"role": "assistant",
                                                                       "content": "more " * 3_000}),
                                       ("litellm_system_prompt", "system " * 3_000),
                                       ("prompt_id", "not-in-the-registry"),
                                       # JSON has no such numbers: LiteLLM cannot send them
                                       ("temperature", float("nan")), ("top_p", float("inf"))])
# Keys of a text part beside its text: Ark may read them as text (the fake does).
part_extras = st.one_of(st.just({}), st.just({}), st.builds(
    lambda key, text: {key: text}, st.sampled_from(["refusal", "annotations", "cache_control"]), texts))


@st.composite
def chat_body(draw: st.DrawFn) -> dict[str, Any]:
    parts: list[Any] = [{"type": "text", "text": draw(texts) + draw(directives), **draw(part_extras)}]
    parts += [{"type": "text", "text": ""}] * draw(st.sampled_from([0, 0, 0, 2_000]))  # joints bill
    fault = draw(faults)
    parts += draw(st.lists(images, max_size=2)) + ([draw(video)] if fault == ("video", None) else [])
    content: Any = parts[0]["text"] if len(parts) == 1 and len(parts[0]) == 2 and draw(st.booleans()) \
        else parts
    message: dict[str, Any] = {"role": "user", "content": content}
    if draw(st.integers(0, 7)) == 0:  # a field Ark reads as JSON, its key included
        message["x" * 2_000] = "y"
    body: dict[str, Any] = {"messages": [message]}
    for name, strategy in (("max_tokens", caps), ("max_completion_tokens", caps), ("n", small_n),
                           ("thinking", thinking)):
        value = draw(strategy)
        if value is not None:
            body[name] = value
    if draw(st.booleans()):
        extra: dict[str, Any] = {}
        for name, strategy in (("max_tokens", caps), ("max_completion_tokens", caps), ("n", small_n),
                               ("thinking", thinking),
                               ("reasoning_effort", st.sampled_from([None, "minimal", "high"])),
                               ("mystery", st.sampled_from([None, "x" * 4_000])),
                               ("messages", st.sampled_from([None, [{
                                   "role": "user",
                                   "content": "big " * 3_000 + " [[fake completion=500]]"}]]))):
            value = draw(strategy)
            if value is not None:
                extra[name] = value
        body["extra_body"] = extra
    if fault is not None and fault[0] != "video":
        where = body["extra_body"] if "extra_body" in body and draw(st.booleans()) else body
        where[fault[0]] = fault[1]
    body["stream"] = draw(st.booleans())
    return body


@st.composite
def responses_body(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"input": draw(texts) + draw(directives)}
    odd = draw(st.sampled_from([None] * 6 + [{"type": "input_text", "text": "bare " * 500},
                                             {"type": "note", "content": "", "detail": "z" * 3_000},
                                             {"role": "assistant", "content": [{
                                                 "type": "output_text", "text": "ok",
                                                 "refusal": "r " * 3_000}]}]))
    if odd is not None:  # an input item that is not a message: Ark may read its whole JSON
        body["input"] = [{"role": "user", "content": body["input"]}, odd]
    if draw(st.booleans()):
        body["instructions"] = draw(texts)
    cap = draw(caps)
    if cap is not None:
        body["max_output_tokens"] = cap
    if draw(st.booleans()):
        body["reasoning"] = {"effort": draw(st.sampled_from(["minimal", "low", "high"]))}
    body["previous_response_id"] = draw(st.sampled_from(["<last>"] * 3 + [None] * 2 + ["resp_bogus"]))
    if draw(st.booleans()):
        body["extra_body"] = {"input": "extra " * draw(st.integers(1, 3_000))}
    if draw(st.integers(0, 7)) == 0:  # a run Ark finishes after the answer: refused (400)
        body.setdefault("extra_body", {})["background"] = True
    body["stream"] = draw(st.booleans())
    return body


@st.composite
def request(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    pool = draw(st.sampled_from(sorted(POOLS)))
    kind = draw(st.sampled_from(["chat"] * 10 + ["responses"] * 4 + ["embed"] * 2 + ["fanout"]))
    if kind == "embed":
        body: dict[str, Any] = {"model": f"{pool}-embed",
                                "input": draw(st.one_of(texts, st.lists(texts, max_size=3)))}
        if draw(st.booleans()):
            body["extra_body"] = {"input": draw(texts)}
        return "/v1/embeddings", body
    if kind == "responses":
        return "/v1/responses", {"model": pool, **draw(responses_body())}
    model = f"{pool},{pool}" if kind == "fanout" else pool
    return "/v1/chat/completions", {"model": model, **draw(chat_body())}


class Run:
    """What the fuzz has seen so far: the last stored response per pool, outcome counts."""

    def __init__(self) -> None:
        self.last_response: dict[str, str] = {}
        self.codes: dict[int, int] = {}


def send(proxy: Proxy, path: str, body: dict[str, Any], cid: str) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": cid,
               "Content-Type": "application/json"}
    # json.dumps, not httpx's encoder: it writes NaN and Infinity as a client's JSON library may
    with httpx.stream("POST", f"{proxy.url}{path}", content=json.dumps(body), headers=headers,
                      timeout=120) as r:
        text = r.read().decode(errors="replace")
        return r.status_code, text


def test_no_request_shape_bills_more_than_its_reservation(fuzzed: Proxy) -> None:
    """Over a few hundred drawn bodies: Ark's ledger never holds more for a call than the guard
    reserved for it, refusals reach no upstream, no 5xx, and the small pool bills 0 at its wall."""
    run = Run()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(request())
    def one(drawn: tuple[str, dict[str, Any]]) -> None:
        path, body = drawn
        pool = body["model"].split(",")[0].removesuffix("-embed")
        if body.get("previous_response_id") == "<last>":
            body["previous_response_id"] = run.last_response.get(pool, "resp_none")
        before = len(fuzzed.fake.chat_requests())
        cid = call_id()
        code, text = send(fuzzed, path, body, cid)
        run.codes[code] = run.codes.get(code, 0) + 1
        assert code < 500, (code, text[:500], body)
        new = fuzzed.fake.chat_requests()[before:]
        if code != 200:
            if code in (400, 429) and not new:
                return
            # a failed upstream call (the fake's own 400) keeps or releases its reservation
        lines = fuzzed.wait_for_log(rf"(\[Usage\]|\[RELEASE\]).*call={cid}\b", timeout=30) if new else []
        consumed = sum(r.consumed for r in new)
        held = sum(int(m.group(1)) for ln in lines if (m := RESERVED.search(ln)))
        released = any("[RELEASE]" in ln for ln in lines)
        assert len(new) <= 1 and (consumed == 0 or (held >= consumed and not released)), (
            consumed, lines, body)
        if path == "/v1/responses" and code == 200 and not body.get("stream"):
            run.last_response[pool] = httpx.Response(200, text=text).json()["id"]

    one()
    print(f"\nshape fuzz: {EXAMPLES} bodies, answers {dict(sorted(run.codes.items()))}")
    deadline = time.monotonic() + 30
    for pool, _ in POOLS.values():
        while fuzzed.state(pool).get("inflight") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fuzzed.state(pool).get("inflight") == 0, pool
        assert fuzzed.fake.pool_totals(pool).billed == 0, (pool, fuzzed.fake.pool_totals(pool))
    assert run.codes.get(200, 0) >= EXAMPLES // 10, run.codes  # the fuzz reached the upstream
    assert "guard error, request refused" not in fuzzed.log()
