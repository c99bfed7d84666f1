"""What the guard's pre-call path costs for 1k / 32k / 200k-token prompts, and how long it
blocks the event loop, next to raw tiktoken (cl100k) on the same text.

    python scripts/bench/precall_bench.py [--url redis://127.0.0.1:6379/0] [--reps 20]

Three measures per prompt size (median of `--reps` runs, after one warm-up run):
- `tiktoken`: `cl100k_base.encode(text)`, the floor any counting pays;
- `count_input`: the guard's sizing of the request (`QuotaGuard._size`: the weighed cl100k count,
  `counting.cl100k_chat`, moved to a worker thread for prompts over 20,000 characters);
- `pre-call hook`: `QuotaGuard.async_pre_call_deployment_hook` end to end (validate, count,
  one reserve on the store), its reservation released afterwards outside the timing.
While each async measure runs, a ticker coroutine sleeps 1 ms in a loop and records how late it
wakes: the worst lateness is how long the event loop was blocked (other requests stalled).
Without `--url` the embedded store is used (no network round trip). Not a test: numbers only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import types
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import tiktoken  # noqa: E402

from volc_quota_guard import admission, counting  # noqa: E402
from volc_quota_guard.config import load_settings  # noqa: E402
from volc_quota_guard.gate import AsyncGate, Gate, Snapshot  # noqa: E402
from volc_quota_guard.gate.keys import KeySpace  # noqa: E402
from volc_quota_guard.gate.records import Records  # noqa: E402
from volc_quota_guard.gate.store import connect, connect_async  # noqa: E402
from volc_quota_guard.proxy.hook import QuotaGuard  # noqa: E402

POOL = "bench/m-1"
CHAT = admission.ROUTES["acompletion"]
LIMITS = admission.limits_for({}, "m-1", default_output=4_096, min_output=1)
SIZES = (1_000, 32_000, 200_000)
# Mixed Chinese and English, like the seed's traffic.
PARAGRAPH = ("火山方舟的免费额度按天返还，每个模型每天最多采集两百万 tokens。"
             "The guard reserves input plus output before each request and settles real usage after. ")


def prompt_of(tokens: int, enc: Any) -> str:
    ids = enc.encode(PARAGRAPH * (tokens // len(enc.encode(PARAGRAPH)) + 1))
    return enc.decode(ids[:tokens])


class Ticker:
    """Sleeps 1 ms in a loop; `worst` is the longest it woke late (the loop was blocked)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._stop = False

    async def run(self) -> None:
        while not self._stop:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - t0 - 0.001)

    async def around(self, fn: Callable[[], Awaitable[Any]]) -> float:
        task = asyncio.create_task(self.run())
        await asyncio.sleep(0.005)  # let the ticker settle into its rhythm
        t0 = time.perf_counter()
        await fn()
        took = time.perf_counter() - t0
        self._stop = True
        await task
        return took


def deployment_call(text: str) -> dict[str, Any]:
    """Deployment-hook kwargs as LiteLLM's router builds them (tests/proxy/test_hook.py's shape)."""
    return {"model": "volcengine/m-1", "messages": [{"role": "user", "content": text}],
            "max_tokens": 1_000, "litellm_call_id": uuid.uuid4().hex,
            "litellm_logging_obj": types.SimpleNamespace(),
            "metadata": {"model_info": {"id": "dep-a", "vqg_account": "bench",
                                        "max_output_tokens": 4096},
                         "model_group": "g", "model_group_size": 1}}


async def measure(url: str | None, reps: int) -> list[dict[str, Any]]:
    enc = tiktoken.get_encoding("cl100k_base")
    keyspace = KeySpace(f"vqgpre-{uuid.uuid4().hex[:8]}")
    sync_gate = Gate(connect(url), keyspace)
    sync_gate.install_snapshot(POOL, Snapshot(10**13, 0, 0, 0, 10**13, int(time.time() * 1000)
                                              + 3_600_000, 0))
    gate = AsyncGate(connect_async(url), keyspace)
    guard = QuotaGuard(load_settings(), gate)
    counting.warm_up()
    idle = Ticker()  # the ticker's own jitter, with nothing else running
    await idle.around(lambda: asyncio.sleep(0.2))
    rows: list[dict[str, Any]] = [{"size": 0, "idle": idle.worst}]
    try:
        for size in SIZES:
            text = prompt_of(size, enc)
            raw = []
            for _ in range(reps + 1):
                t0 = time.perf_counter()
                enc.encode(text)
                raw.append(time.perf_counter() - t0)
            counted, count_block = [], 0.0
            params = {"messages": [{"role": "user", "content": text}]}
            for n in range(reps + 1):  # run 0 warms up: its time and blocking are left out
                ticker = Ticker()
                counted.append(await ticker.around(lambda p=params: QuotaGuard._size(p, CHAT, LIMITS, None)))
                count_block = max(count_block, ticker.worst if n else 0.0)
            hooked, hook_block = [], 0.0
            for n in range(reps + 1):
                kw = deployment_call(text)
                ticker = Ticker()
                hooked.append(await ticker.around(
                    lambda kw=kw: guard.async_pre_call_deployment_hook(kw, "acompletion")))
                hook_block = max(hook_block, ticker.worst if n else 0.0)
                for rid in kw["metadata"]["vqg_reservations"].values():
                    await gate.release(POOL, rid)
            med = statistics.median
            rows.append({"size": size, "chars": len(text), "tiktoken": med(raw[1:]),
                         "count": med(counted[1:]), "count_block": count_block,
                         "hook": med(hooked[1:]), "hook_block": hook_block})
    finally:
        Records(connect(url), keyspace).clear()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=None, help="Redis URL (default: the embedded store)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    rows = asyncio.run(measure(args.url, args.reps))
    print("| prompt (cl100k tokens / chars) | raw tiktoken encode | guard `count_input` | "
          "loop blocked (worst) | pre-call hook incl. reserve | loop blocked (worst) |")
    print("|---|---|---|---|---|---|")
    print(f"| idle loop (ticker jitter alone) | | | {rows[0]['idle'] * 1000:.2f} ms | | |")
    for r in rows[1:]:
        print(f"| {r['size']:,} / {r['chars']:,} | {r['tiktoken'] * 1000:.2f} ms | "
              f"{r['count'] * 1000:.2f} ms | {r['count_block'] * 1000:.2f} ms | "
              f"{r['hook'] * 1000:.2f} ms | {r['hook_block'] * 1000:.2f} ms |")


if __name__ == "__main__":
    main()
