"""Helpers for the fault tests: the LiteLLM hook driven in-process, a billing world on a
ManualClock, and the bookkeeping checks every fault must leave true."""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from datetime import datetime
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm: no network

import litellm  # noqa: E402
import redis  # noqa: E402

from volc_quota_guard.clock import BEIJING, ManualClock  # noqa: E402
from volc_quota_guard.config import Settings  # noqa: E402
from volc_quota_guard.fake import FakeVolcengine  # noqa: E402
from volc_quota_guard.gate import Gate  # noqa: E402
from volc_quota_guard.gate.keys import KeySpace  # noqa: E402
from volc_quota_guard.sync import SyncService  # noqa: E402
from volc_quota_guard.volcengine.billing import BillingClient  # noqa: E402
from volc_quota_guard.volcengine.packages import PoolSpec  # noqa: E402

ACCOUNT = "acct-a"
MODEL = "deepseek-v4-flash-ga-260731"
POOL = f"{ACCOUNT}/{MODEL}"
CREDENTIALS = {"VOLC_ACCESSKEY_ACCT_A": "AKLTacctafake0001", "VOLC_SECRETKEY_ACCT_A": "c2VjcmV0LWZha2UtYQ=="}
MIN = 60_000


def beijing_ms(text: str) -> int:
    """'2026-08-14 09:00[:30]' in Beijing time, as ms since the epoch."""
    fmt = "%Y-%m-%d %H:%M:%S" if text.count(":") == 2 else "%Y-%m-%d %H:%M"
    return int(datetime.strptime(text, fmt).replace(tzinfo=BEIJING).timestamp() * 1000)


# ---- the hook, as the router calls it -----------------------------------------------------------

def call(text: str = "hello", call_id: str = "call-1", **params: Any) -> dict[str, Any]:
    """Deployment-hook kwargs for one attempt on the pool's only deployment."""
    return {"model": f"volcengine/{MODEL}", "messages": [{"role": "user", "content": text}],
            "litellm_call_id": call_id, "litellm_logging_obj": types.SimpleNamespace(),
            "metadata": {"model_info": {"id": "dep-a", "vqg_account": ACCOUNT, "max_output_tokens": 4096},
                         "model_group": "g", "model_group_size": 1}, **params}


def success_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    """What `async_log_success_event` receives for that attempt."""
    return {"model": MODEL, "custom_llm_provider": "volcengine", "stream": False,
            "litellm_call_id": kw["litellm_call_id"],
            "litellm_params": {"metadata": kw["metadata"], "model_info": kw["metadata"]["model_info"]}}


def response(prompt: int, completion: int) -> litellm.ModelResponse:
    return litellm.ModelResponse(usage=litellm.Usage(prompt_tokens=prompt, completion_tokens=completion))


DEPLOYMENTS = [{"litellm_params": {"model": f"volcengine/{MODEL}"},
                "model_info": {"id": "dep-a", "vqg_account": ACCOUNT}}]


# ---- the books ----------------------------------------------------------------------------------

def _ints(raw: dict[Any, Any]) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in raw.items()}


def check_books(client: redis.Redis, keyspace: KeySpace, pool: str = POOL) -> dict[str, int]:
    """Every request counted exactly once: the lifetime counter equals the sum of what each
    resolved request counted, in-flight equals the open reservations, nothing is negative."""
    keys = keyspace.pool(pool)
    state = {k: int(v) for k, v in _ints(client.hgetall(keys.state)).items() if v.lstrip("-").isdigit()}
    resolved = _ints(client.hgetall(keys.resolved))
    open_ = _ints(client.hgetall(keys.reservations))
    counted = sum(int(v.split(":")[1]) for v in resolved.values())
    held = sum(int(v.split(":")[0]) for v in open_.values())
    assert not set(resolved) & set(open_), "a request both open and resolved"
    assert state.get("ucum", 0) == counted, (state, counted)
    assert state.get("inflight", 0) == held, (state, held)
    assert state.get("day_usage", 0) >= 0 and state.get("ucum", 0) >= 0 and held >= 0
    assert client.zcard(keys.deadlines) == len(open_)
    return {"ucum": counted, "inflight": held, "resolved": len(resolved), "open": len(open_)}


# ---- billing world on a manual clock ------------------------------------------------------------

@dataclass
class BillingWorld:
    """The fake Volcengine (HTTP billing API) and one proxy's gate + sync service, one clock."""

    clock: ManualClock
    fake: FakeVolcengine
    cfg: Settings
    client: redis.Redis
    keyspace: KeySpace
    seq: int = 0

    @property
    def gate(self) -> Gate:
        return self.service.gate

    def __post_init__(self) -> None:
        def lister(account: str) -> BillingClient:
            return BillingClient.for_account(account, config=self.cfg, env=CREDENTIALS, wait_initial=0.01,
                                             wait_max=0.02, wait_jitter=0.0, attempts=2, page_interval=0)

        self.service = SyncService(self.cfg, Gate(self.client, self.keyspace, self.clock),
                                   lambda: [PoolSpec(POOL)], lister)

    def request(self, tokens: int, duration_ms: int = 10_000) -> str:
        """One request: reserve, the upstream consumes `tokens`, settle; the gate's reason."""
        self.seq += 1
        rid = f"req-{self.seq}"
        d = self.gate.reserve(POOL, rid, tokens)
        if not d.admitted:
            return d.reason
        self.clock.advance(duration_ms)
        self.fake.consume(POOL, tokens)
        self.gate.settle(POOL, rid, tokens)
        return d.reason

    def minutes(self, n: int, tokens: int) -> list[str]:
        """`n` minutes of traffic, one request a minute, the sync thread ticking before each."""
        reasons = []
        for _ in range(n):
            start = self.clock.now_ms()
            self.service.tick()
            reasons.append(self.request(tokens) if tokens else "idle")
            self.clock.set(start + MIN)
        return reasons
