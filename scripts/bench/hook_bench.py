"""CPU per request of the guard's own hot path, in process: every hook one proxied chat request
runs through, on a real LiteLLM router built from the shipped example config.

    python scripts/bench/hook_bench.py [--url redis://127.0.0.1:6379/0] [--requests 2000]

Per request: `async_pre_call_hook` (validate, the group's eviction read), `async_filter_deployments`
(reuses that read), `async_pre_call_deployment_hook` (deployment look-up, sizing with the
deployment's counting method, one reserve), `log_pre_api_call`, `async_log_success_event` (one
settle, the usage line). The prompt is the proxy benchmark's (~300-token Chinese prompt on the
DeepSeek deployment, so the exact DeepSeek-V4 tokenizer counts it); `--distinct` gives every
request its own prompt text (no repeated text to reuse). The figure is process CPU time
(user + system, this process only: the Redis server's time is not in it) per request, the
median of `--rounds` rounds. Without `--url` the embedded store is used. Not a test: numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
import types
import uuid
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
import yaml  # noqa: E402

from volc_quota_guard import demo  # noqa: E402
from volc_quota_guard.config import load_settings  # noqa: E402
from volc_quota_guard.gate import AsyncGate, Gate, Snapshot  # noqa: E402
from volc_quota_guard.gate.keys import KeySpace  # noqa: E402
from volc_quota_guard.gate.records import Records  # noqa: E402
from volc_quota_guard.gate.store import connect, connect_async  # noqa: E402
from volc_quota_guard.proxy.hook import QuotaGuard  # noqa: E402

GROUP = "deepseek-v4-flash"


def router() -> Any:
    config = yaml.safe_load(demo.EXAMPLE_CONFIG.read_text())
    for dep in config["model_list"]:
        # one key per account: the guard refuses a key shared by two accounts
        account = dep["model_info"].get("vqg_account", "default")
        dep["litellm_params"].update(api_base="http://127.0.0.1:9/v3", api_key=f"sk-bench-{account}")
    return litellm.Router(model_list=config["model_list"])


def install_router(r: Any) -> None:
    """Where the hook finds the proxy's router (calls.llm_router), without importing the proxy."""
    module = types.ModuleType("litellm.proxy.proxy_server")
    module.llm_router = r  # type: ignore[attr-defined]
    sys.modules.setdefault("litellm.proxy.proxy_server", module)


def proxy_data(text: str) -> dict[str, Any]:
    return {"model": GROUP, "max_tokens": 200, "messages": [{"role": "user", "content": text}],
            "litellm_call_id": uuid.uuid4().hex, "litellm_logging_obj": types.SimpleNamespace(),
            "metadata": {"user_api_key": "hashed", "headers": {"content-type": "application/json"}}}


def deployment_kwargs(data: dict[str, Any], dep: dict[str, Any]) -> dict[str, Any]:
    """The router's kwargs for the deployment hook, as Router._acompletion builds them."""
    kw = dict(data)
    kw["model"] = dep["litellm_params"]["model"]
    kw["metadata"] = dict(data["metadata"], model_group=GROUP, model_group_size=2,
                          deployment=dep["litellm_params"]["model"], model_info=dep["model_info"],
                          api_base=dep["litellm_params"]["api_base"])
    return kw


def success_kwargs(kw: dict[str, Any]) -> dict[str, Any]:
    return {"model": kw["model"].split("/", 1)[1], "custom_llm_provider": "volcengine",
            "stream": False, "litellm_call_id": kw["litellm_call_id"],
            "litellm_logging_obj": kw["litellm_logging_obj"],
            "litellm_params": {"metadata": kw["metadata"], "model_info": kw["metadata"]["model_info"]}}


async def one(guard: QuotaGuard, r: Any, text: str, resp: Any) -> None:
    data = proxy_data(text)
    await guard.async_pre_call_hook(None, None, data, "acompletion")
    healthy = r.get_model_list(model_name=GROUP)
    kept = await guard.async_filter_deployments(GROUP, healthy, data["messages"], request_kwargs=data)
    kw = deployment_kwargs(data, kept[0])
    await guard.async_pre_call_deployment_hook(kw, "acompletion")
    guard.log_pre_api_call(kw["model"], kw["messages"], kw)
    await guard.async_log_success_event(success_kwargs(kw), resp, None, None)


async def measure(url: str | None, requests: int, rounds: int, distinct: bool) -> list[float]:
    r = router()
    install_router(r)
    keyspace = KeySpace(f"vqghook-{uuid.uuid4().hex[:8]}")
    sync_gate = Gate(connect(url), keyspace)
    for pool in demo.POOLS:
        sync_gate.install_snapshot(pool, Snapshot(10**13, 0, 0, 0, 10**13,
                                                  int(time.time() * 1000) + 3_600_000, 0))
    guard = QuotaGuard(load_settings(), AsyncGate(connect_async(url), keyspace))
    resp = litellm.ModelResponse(usage=litellm.Usage(prompt_tokens=170, completion_tokens=100))
    base = f"[[fake completion=100]] {demo.PROMPT}"
    per: list[float] = []
    try:
        for _ in range(30):  # warm up: tokenizers, LiteLLM's lazy imports, the Lua scripts
            await one(guard, r, base, resp)
        for n in range(rounds):
            texts = [f"{i} {n} {base}" if distinct else base for i in range(requests)]
            t0 = time.process_time()
            for text in texts:
                await one(guard, r, text, resp)
            per.append((time.process_time() - t0) / requests)
    finally:
        Records(connect(url), keyspace).clear()
    return per


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=None, help="Redis URL (default: the embedded store)")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--distinct", action="store_true", help="a different prompt on every request")
    args = ap.parse_args()
    logging.getLogger("volc_quota_guard").handlers[:] = [logging.StreamHandler(open(os.devnull, "w"))]
    per = asyncio.run(measure(args.url, args.requests, args.rounds, args.distinct))
    print(f"guard hot path: {statistics.median(per) * 1e6:.0f} µs CPU per request "
          f"(median of {len(per)} rounds of {args.requests}; rounds "
          f"{', '.join(f'{p * 1e6:.0f}' for p in per)} µs)")


if __name__ == "__main__":
    main()
