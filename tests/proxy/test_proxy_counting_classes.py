"""Text the cheap count once under-held, through a real proxy against the fake Ark (red team, stop 23).

Each body is one class the count missed: a long cl100k token DeepSeek-V4 (the fake's Doubao)
splits into many pieces, a run of short units, thousands of empty or one-character text parts,
non-ASCII JSON in a byte-bounded field, many one-token embedding inputs. Each is sent on pools
of the three counting methods (Doubao: `ark-api`; Kimi: `cl100k`; DeepSeek: `deepseek`), none
with anything learned yet, and what Ark's ledger holds for the call must be within what the
guard reserved for it (the `reserved=` of its Usage line). Two pools 10,000 tokens from their
walls must bill 0. Before the fixes, `ABC…Z` x1,800 reserved 3,380 and consumed 24,361 (and
billed 13,361 at the wall); 20,000 empty parts reserved 41 and consumed 22,127.
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
FAMILIES = {"db": "doubao", "kimi": "kimi", "ds": "deepseek"}
CASES = ("abc", "brace", "empty-parts", "newline-parts", "embed-abc", "embed-many", "fco", "system")
POOLS = {f"{case}-{fam}": (f"acct-c/{model}-{case}-260101", 50_000_000)
         for case in CASES for fam, model in FAMILIES.items()}
POOLS |= {"wall-kimi": ("acct-c/kimi-wall-260101", BUFFER + 10_000),
          "wall-db": ("acct-c/doubao-wall-260101", BUFFER + 10_000)}
RESERVED = re.compile(r"reserved=(\d+)")
ABC = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
OFF = {"thinking": {"type": "disabled"}}


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


def chat(model: str, content: Any) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"model": model, "max_tokens": 20,
                                    "messages": [{"role": "user", "content": content}], **OFF}


def body(case: str, model: str) -> tuple[str, dict[str, Any]]:
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
        item = {"type": "function_call_output", "call_id": "c1", "output": ["é" * 6_000]}
        return "/v1/responses", {"model": model, "input": [{"role": "user", "content": "hi"}, item],
                                 "max_output_tokens": 20, **OFF}
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
    assert status == 200 and consumed > 1_000, (status, consumed)
    assert held >= consumed, (case, fam, held, consumed)


@pytest.mark.parametrize(("model", "case"), [("wall-kimi", "abc"), ("wall-db", "empty-parts")])
def test_a_pool_near_its_wall_bills_0(px: Proxy, model: str, case: str) -> None:
    """10,000 tokens from the wall: the request is refused or fits; either way nothing is billed."""
    status, _, _ = send(px, *body(case, model))
    assert status in (200, 429)
    deadline = time.monotonic() + 20
    pool = POOLS[model][0]
    while px.state(pool).get("inflight") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert px.fake.pool_totals(pool).billed == 0
