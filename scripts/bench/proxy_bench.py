"""What the guard costs a LiteLLM proxy: the same traffic through a bare proxy and a guarded one.

    python scripts/bench/proxy_bench.py [--requests 600] [--concurrency 16] [--url redis://…]

Both proxies run the shipped example config in front of the fake Volcengine (zero latency,
packages too big to ever block); the bare one has no callbacks. Prints the README's table.
Not a test: numbers, not assertions.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import yaml
from rich.console import Console

from volc_quota_guard import demo
from volc_quota_guard.store import serve_embedded

BIG = 10**12


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


def run(mode: str, store_url: str, args: argparse.Namespace, console: Console) -> dict[str, float]:
    fake = demo.start_fake()
    for pool in demo.POOLS:
        fake.add_package(pool, BIG)
    workdir = Path(tempfile.mkdtemp(prefix=f"vqg-bench-{mode}-"))
    config = yaml.safe_load(demo.EXAMPLE_CONFIG.read_text())
    if mode == "bare":
        config.pop("litellm_settings", None)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = demo.proxy_env(fake, store_url, f"vqgbench-{uuid.uuid4().hex[:8]}")
    ready = demo._synced if mode == "guarded" else (lambda log: True)
    proc, url = demo.start_proxy(env, workdir / "proxy.log", console, config=path, ready=ready)
    try:
        return measure(url, args.requests, args.concurrency)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        fake.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--url", default=None, help="Redis URL (default: the embedded store over TCP)")
    args = ap.parse_args()
    console = Console(stderr=True)
    embedded = None if args.url else serve_embedded()
    store_url = args.url or embedded.url  # type: ignore[union-attr]
    results = {mode: run(mode, store_url, args, console) for mode in ("bare", "guarded")}
    print(f"| proxy ({args.requests} requests, concurrency {args.concurrency}) | req/s | p50 | p99 |")
    print("|---|---|---|---|")
    for mode, r in results.items():
        print(f"| {mode} | {r['rps']:.1f} | {r['p50']:.0f} ms | {r['p99']:.0f} ms |")
    if embedded is not None:
        embedded.stop()


if __name__ == "__main__":
    main()
