"""One call through the proxy: what the fake Ark consumed for it against what the guard held."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import httpx
from proxy_support import MASTER_KEY, Proxy, call_id

RESERVED = re.compile(r"reserved=(\d+)")


@dataclass
class Outcome:
    code: int
    text: str
    consumed: int
    held: int
    released: bool
    upstream: list[Any]
    records: list[Any]
    lines: list[str]

    def __str__(self) -> str:
        return (f"code={self.code} consumed={self.consumed} held={self.held} released={self.released} "
                f"calls={len(self.records)} text={self.text[:200]!r}")


def send(px: Proxy, path: str, body: dict[str, Any], stream: bool = False,
         headers: dict[str, str] | None = None) -> Outcome:
    before_rec = len(px.fake.chat_requests())
    before_up = len(px.fake.upstream_requests())
    cid = call_id()
    h = {"Authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": cid, **(headers or {})}
    with httpx.stream("POST", f"{px.url}{path}", json=body, headers=h, timeout=120) as r:
        text = r.read().decode(errors="replace")
        code = r.status_code
    time.sleep(0.3)
    recs = px.fake.chat_requests()[before_rec:]
    ups = px.fake.upstream_requests()[before_up:]
    lines: list[str] = []
    if recs:
        try:
            lines = px.wait_for_log(rf"(\[Usage\]|\[RELEASE\]).*call={cid}\b", timeout=15)
        except AssertionError:
            lines = []
        time.sleep(0.2)
        lines = [ln for ln in px.log().splitlines() if f"call={cid}" in ln
                 and ("[Usage]" in ln or "[RELEASE]" in ln)]
    consumed = sum(r.consumed for r in recs)
    held = sum(int(m.group(1)) for ln in lines if (m := RESERVED.search(ln)))
    released = any("[RELEASE]" in ln for ln in lines)
    return Outcome(code, text, consumed, held, released, ups, recs, lines)
