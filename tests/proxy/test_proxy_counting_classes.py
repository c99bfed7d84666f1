"""Text the cheap count once under-held, through a real proxy against the fake Ark (red team, stop 23).

Each body is one class the count missed: a long cl100k token DeepSeek-V4 (the fake's Doubao)
splits into many pieces, a run of short units, thousands of empty or one-character text parts,
non-ASCII JSON in a byte-bounded field, many one-token embedding inputs; then (a second pass) a
message key of 26,000 characters, 2,000 tool messages, a Responses input item that is a bare
part (a 60 KB image data URL: 36 reserved, 57,000 billed) or of an unknown type or role. Each
is sent on pools of the three counting methods (Doubao: `ark-api`; Kimi: `cl100k`; DeepSeek:
`deepseek`), none with anything learned yet, and what Ark's ledger holds for the call must be
within what the guard reserved for it (the `reserved=` of its Usage line). Pools 10,000 tokens
from their walls must bill 0, also under a burst of words V4 splits in two (billed ~2.1 x the
cheap count: not covered per call by k = 1.7, but by the in-flight ceiling at the wall).
Before the fixes, `ABC…Z` x1,800 reserved 3,380 and consumed 24,361 (and billed 13,361 at the
wall); 20,000 empty parts reserved 41 and consumed 22,127.
"""

from __future__ import annotations

import base64
import re
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from proxy_support import MASTER_KEY, Proxy, ark_deployment, call_id, start_syncing_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy
BUFFER = 1_000
FAMILIES = {"db": "doubao", "kimi": "kimi", "ds": "deepseek"}
CASES = ("abc", "brace", "empty-parts", "newline-parts", "embed-abc", "embed-many", "fco", "system",
         # second pass: message keys, many tool messages, words V4 splits in two, odd Responses items
         "long-key", "tool-msgs", "bare-image", "bare-text", "item-type", "item-role")
POOLS = {f"{case}-{fam}": (f"acct-c/{model}-{case}-260101", 50_000_000)
         for case in CASES for fam, model in FAMILIES.items()}
POOLS |= {"wall-kimi": ("acct-c/kimi-wall-260101", BUFFER + 10_000),
          "wall-db": ("acct-c/doubao-wall-260101", BUFFER + 10_000),
          "wall-ds": ("acct-c/deepseek-wall-260101", BUFFER + 10_000),
          "burst-kimi": ("acct-c/kimi-burst-260101", BUFFER + 10_400),  # 5 x 2,030 reserved fit
          "burst-db": ("acct-c/doubao-burst-260101", BUFFER + 10_400)}
RESERVED = re.compile(r"reserved=(\d+)")
ABC = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
OFF = {"thinking": {"type": "disabled"}}
WORDS = [" mAuth", " indo", " Jelly", " refute", " kotlin", " getElement", " indian", " Qualität", " justo",
         " spectro", " aime", " decrypted", " fiberglass", " onDestroy", " Convenient", " glean", " Flyers",
         " Iranians", " treff", " Covers"]  # one cl100k token each, two V4 tokens each
PNG = (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">IIBBBBB", 16, 16, 8, 2, 0, 0, 0)
       + b"\0" * 4 + bytes(range(256)) * 234)  # a 16x16 image in a 60 KB data URL
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


@pytest.fixture(scope="module")
def px(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
       prefix: str) -> Iterator[Proxy]:
    info = {"max_input_tokens": 131_072}
    deployments = [d for name, (pool, _) in POOLS.items() for d in (
        ark_deployment(name, pool, **info), ark_deployment(f"{name}-embed", pool, mode="embedding", **info))]
    p = start_syncing_proxy(tmp_path_factory.mktemp("classes"), fake, store_url, prefix,
                            dict(POOLS.values()), deployments,
                            VQG_SMALL_BUFFER=str(BUFFER), VQG_EVICT_BELOW="100")
    yield p
    stop_proxy(p)


def chat(model: str, content: Any, *more: dict[str, Any], **fields: Any) -> tuple[str, dict[str, Any]]:
    """A chat of one user message (`fields` added to it) and `more` messages after it."""
    return "/v1/chat/completions", {"model": model, "max_tokens": 20, **OFF,
                                    "messages": [{"role": "user", "content": content, **fields}, *more]}


def responses(model: str, items: list[Any]) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {"model": model, "input": items, "max_output_tokens": 20, **OFF}


def body(case: str, model: str) -> tuple[str, dict[str, Any]]:  # noqa: PLR0911  one per case
    if case == "long-key":
        return chat(model, "hi", **{ABC * 1_000: ""})
    if case == "tool-msgs":
        return chat(model, "go", *[{"role": "tool", "tool_call_id": "c", "content": "ok"}] * 2_000)
    if case == "bare-image":
        return responses(model, [{"type": "input_image", "image_url": DATA_URL}])
    if case == "bare-text":
        return responses(model, [{"type": "input_text", "text": ""}] * 5_000)
    if case == "item-type":
        return responses(model, [{"role": "user", "content": "hi"},
                                 {"type": "x" + ABC * 1_000, "content": ""}])
    if case == "item-role":
        return responses(model, [{"type": "x", "role": ABC * 1_000, "content": ""}])
    if case == "abc":
        return chat(model, ABC * 1_800)
    if case == "brace":
        return chat(model, "}\r\n\r\n\r\n\r\n" * 1_900)
    if case == "empty-parts":
        return chat(model, [{"type": "text", "text": ""}] * 20_000)
    if case == "newline-parts":
        return chat(model, [{"type": "text", "text": "\n"}] * 10_000)
    if case == "embed-abc":
        return "/v1/embeddings", {"model": f"{model}-embed", "input": ABC * 1_800}
    if case == "embed-many":
        return "/v1/embeddings", {"model": f"{model}-embed", "input": ["a"] * 20_000}
    if case == "fco":
        return responses(model, [{"role": "user", "content": "hi"},
                                 {"type": "function_call_output", "call_id": "c1", "output": ["é" * 6_000]}])
    return "/v1/messages", {"model": model, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}],
                            "system": [{"type": "text", "text": ABC * 1_800}]}


def send(px: Proxy, path: str, data: dict[str, Any]) -> tuple[int, int, int]:
    """(status, what the guard reserved for the call, what Ark's ledger consumed for it)."""
    cid, before = call_id(), len(px.fake.chat_requests())
    r = httpx.post(f"{px.url}{path}", json=data, timeout=120,
                   headers={"authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": cid})
    new = px.fake.chat_requests()[before:]
    lines = px.wait_for_log(rf"(\[Usage\]|\[RELEASE\]).*call={cid}\b", timeout=30) if new else []
    held = sum(int(m.group(1)) for ln in lines if (m := RESERVED.search(ln)))
    return r.status_code, held, sum(c.consumed for c in new)


@pytest.mark.parametrize("fam", sorted(FAMILIES))
@pytest.mark.parametrize("case", CASES)
def test_what_ark_bills_for_the_call_is_within_its_reservation(px: Proxy, case: str, fam: str) -> None:
    status, held, consumed = send(px, *body(case, f"{case}-{fam}"))
    assert status == 200 and consumed > 0, (status, consumed)  # it reached Ark's ledger
    assert held >= consumed, (case, fam, held, consumed)


@pytest.mark.parametrize(("model", "case"), [("wall-kimi", "abc"), ("wall-db", "empty-parts"),
                                             ("wall-kimi", "long-key"), ("wall-db", "bare-image"),
                                             ("wall-ds", "bare-image")])
def test_a_pool_near_its_wall_bills_0(px: Proxy, model: str, case: str) -> None:
    """10,000 tokens from the wall: the request is refused or fits; either way nothing is billed."""
    status, _, _ = send(px, *body(case, model))
    assert status in (200, 429)
    deadline = time.monotonic() + 20
    pool = POOLS[model][0]
    while px.state(pool).get("inflight") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert px.fake.pool_totals(pool).billed == 0


@pytest.mark.parametrize("model", ["burst-kimi", "burst-db"])
def test_a_burst_of_text_billed_twice_its_count_bills_0_at_the_wall(px: Proxy, model: str) -> None:
    """Words DeepSeek-V4 splits in two and cl100k keeps whole (the fake's Doubao bills them 2.1 x
    the cheap count, past k = 1.7): seven at once, 10,400 tokens from the wall. By k, five fit
    (5 x 2,030 reserved) and consume 12,130 of 11,400 free; the in-flight ceiling (3.0 x the
    count) admits fewer (with VQG_ESTIMATE_CORRECTION_MAX=1.7 this pool bills 730)."""
    text = "".join(WORDS[i % 20] for i in range(1_150)) + " [[fake delay=1.0]]"
    with ThreadPoolExecutor(7) as pool:
        answers = list(pool.map(lambda _: send(px, *chat(model, text)), range(7)))
    assert {a[0] for a in answers} <= {200, 429} and any(a[0] == 200 for a in answers), answers
    assert px.fake.pool_totals(POOLS[model][0]).consumed > 2 * 2_400  # V4's count, several times
    deadline = time.monotonic() + 20
    pool_id = POOLS[model][0]
    while px.state(pool_id).get("inflight") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert px.fake.pool_totals(pool_id).billed == 0
