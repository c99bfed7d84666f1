"""What the guard costs a LiteLLM proxy: the same traffic through a bare proxy and a guarded one.

    python scripts/bench/proxy_bench.py [--requests 600] [--concurrency 1 16 64] [--url redis://…]

Both proxies run the shipped example config in front of the fake Volcengine (zero latency,
packages too big to ever block); `bare` has no callbacks, `no-op` registers a callback with the
guard's hooks doing nothing (what LiteLLM's callback machinery costs by itself), `guarded` is the
guard. The three proxies run side by side and take turns at each concurrency level. Prints the
README's table.
Not a test: numbers, not assertions.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
import yaml
from rich.console import Console

from volc_quota_guard import demo
from volc_quota_guard.fake import FakeVolcengine
from volc_quota_guard.store import serve_embedded

BIG = 10**12
MODES = ("bare", "no-op", "guarded")
NOOP_MODULE = '''
from litellm.integrations.custom_logger import CustomLogger


class NoOp(CustomLogger):
    """The guard's hooks, doing nothing (the proxy only calls hooks the class defines itself)."""

    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):
        return None

    async def async_filter_deployments(self, model, healthy_deployments, messages,
                                       request_kwargs=None, parent_otel_span=None):
        return healthy_deployments

    async def async_pre_call_deployment_hook(self, kwargs, call_type):
        return None

    def log_pre_api_call(self, model, messages, kwargs):
        pass

    async def async_post_call_response_headers_hook(self, data, user_api_key_dict, response,
                                                    request_headers=None, litellm_call_info=None):
        return None

    async def async_post_call_streaming_iterator_hook(self, user_api_key_dict, response, request_data):
        async for item in response:
            yield item

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        pass

    async def async_post_call_failure_deployment_hook(self, request_data, exception, call_type,
                                                      fallback_depth=None):
        pass

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        pass


handler = NoOp()
'''


def measure(url: str, requests: int, concurrency: int) -> dict[str, float]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=demo.MASTER_KEY, max_retries=0, timeout=60)

    def one(_: int) -> float:
        t0 = time.perf_counter()
        client.chat.completions.create(model="deepseek-v4-flash", max_tokens=200, messages=[
            {"role": "user", "content": f"[[fake completion=100]] {demo.PROMPT}"}])
        return time.perf_counter() - t0

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(2 * concurrency)))  # warm up
        started = time.perf_counter()
        lat = list(pool.map(one, range(requests)))
        elapsed = time.perf_counter() - started
    q = statistics.quantiles(lat, n=100)
    return {"rps": requests / elapsed, "p50": q[49] * 1000, "p99": q[98] * 1000}


@dataclass
class Running:
    url: str
    proc: subprocess.Popen[bytes]
    fake: FakeVolcengine

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=15)
        self.fake.stop()


def start(mode: str, store_url: str, console: Console) -> Running:
    fake = demo.start_fake()
    for pool in demo.POOLS:
        fake.add_package(pool, BIG)
    workdir = Path(tempfile.mkdtemp(prefix=f"vqg-bench-{mode}-"))
    config = yaml.safe_load(demo.EXAMPLE_CONFIG.read_text())
    if mode == "bare":
        config.pop("litellm_settings", None)
    elif mode == "no-op":  # LiteLLM loads `module.attr` callbacks from the config's folder
        (workdir / "vqg_bench_noop.py").write_text(NOOP_MODULE)
        config["litellm_settings"]["callbacks"] = "vqg_bench_noop.handler"
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = demo.proxy_env(fake, store_url, f"vqgbench-{uuid.uuid4().hex[:8]}")
    ready = demo._synced if mode == "guarded" else (lambda log: True)
    proc, url = demo.start_proxy(env, workdir / "proxy.log", console, config=path, ready=ready)
    return Running(url, proc, fake)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--url", default=None, help="Redis URL (default: the embedded store over TCP)")
    args = ap.parse_args()
    console = Console(stderr=True)
    embedded = None if args.url else serve_embedded()
    store_url = args.url or embedded.url  # type: ignore[union-attr]
    proxies: dict[str, Running] = {}
    try:
        for mode in MODES:
            proxies[mode] = start(mode, store_url, console)
        # The modes take turns at each level, so a change in the machine's load hits them alike.
        results = {(mode, c): measure(p.url, args.requests, c)
                   for c in args.concurrency for mode, p in proxies.items()}
    finally:
        for p in proxies.values():
            p.stop()
        if embedded is not None:
            embedded.stop()
    print(f"| proxy ({args.requests} requests per row) | concurrency | req/s | p50 | p99 |")
    print("|---|---|---|---|---|")
    for (mode, c), r in results.items():
        print(f"| {mode} | {c} | {r['rps']:.1f} | {r['p50']:.1f} ms | {r['p99']:.1f} ms |")


if __name__ == "__main__":
    main()
