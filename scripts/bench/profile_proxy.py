"""Where a guarded request's time goes: py-spy on the proxy under load, plus Redis calls per request.

    python scripts/bench/profile_proxy.py [--mode guarded] [--concurrency 16] [--seconds 20]

Starts one proxy of `proxy_bench.py` (`--mode`, default `guarded`) on a private redis-server
(its own port, no persistence, stopped at the end; `--url` to use another store), drives the
benchmark's load at `--concurrency`, and meanwhile samples the proxy process with py-spy
(`pip install py-spy`; not a dependency). Prints the proxy's on-CPU time per request split by
component, and the Redis commands per request from INFO commandstats (the server is private,
so they are all the proxy's). `--raw FILE` keeps py-spy's collapsed stacks. Not a test.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import redis
from rich.console import Console

sys.path.insert(0, str(Path(__file__).parent))
import proxy_bench  # noqa: E402

# First match wins, checked over the whole stack: the guard's own work before the machinery around it.
CATEGORIES: list[tuple[str, re.Pattern[str]]] = [
    ("guard: token counting", re.compile(r"volc_quota_guard/counting\.py|volc_quota_guard/admission\.py.*"
                                         r"count_input")),
    ("guard: Redis client (gate)", re.compile(r"volc_quota_guard/(gate|store)\.py")),
    ("guard: logging", re.compile(r"volc_quota_guard/.*\blogging/__init__\.py")),
    ("guard: metrics", re.compile(r"volc_quota_guard/metrics\.py")),
    ("guard: hook (rest)", re.compile(r"volc_quota_guard/")),
    ("LiteLLM logging / callbacks", re.compile(r"litellm_logging\.py|custom_logger|"
                                               r"logging_callback_manager|success_handler|"
                                               r"litellm_core_utils/logging_worker")),
    ("LiteLLM router", re.compile(r"litellm/router\.py|router_utils|router_strategy")),
    ("upstream HTTP client", re.compile(r"/(httpx|httpcore|aiohttp|h11)/|llm_http_handler")),
    ("LiteLLM completion (request/response)", re.compile(r"litellm/(main|utils)\.py|llms/|"
                                                         r"litellm_core_utils")),
    ("proxy: auth / FastAPI / uvicorn", re.compile(r"proxy_server\.py|/auth/|/fastapi/|/starlette/|"
                                                    r"/uvicorn/|/pydantic|proxy/")),
    ("redis client (LiteLLM's)", re.compile(r"/redis/")),
    ("asyncio / other", re.compile(r"")),
]


# Leaf frames of threads that wait (py-spy's idle detection misses lock and queue waits).
IDLE_LEAVES = {"_worker", "Condition.wait", "Event.wait", "wait", "select", "poll", "sleep", "get",
               "_wait_for_tstate_lock", "accept"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _name(frame: str) -> str:
    return frame.split(" (", 1)[0]


def categorise(raw: str) -> tuple[Counter[str], Counter[str]]:
    """(samples per category, samples per guard hook) from py-spy's `--format raw` output
    (collapsed stacks, `frame;frame;… count`); waiting threads are left out."""
    found: Counter[str] = Counter()
    hooks: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if _name(frames[-1]) in IDLE_LEAVES:
            continue
        name = next(n for n, pat in CATEGORIES if pat.search(stack))
        found[name] += int(count)
        guard = [_name(f) for f in frames if "volc_quota_guard/" in f]
        if guard:
            hooks[guard[0]] += int(count)
    return found, hooks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=proxy_bench.MODES, default="guarded")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--url", default=None, help="a Redis URL instead of a private redis-server")
    ap.add_argument("--raw", type=Path, default=None, help="keep py-spy's collapsed stacks here")
    args = ap.parse_args()
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy is not installed (pip install py-spy)")
    console = Console(stderr=True)
    server = None
    url = args.url
    if url is None:
        port = _free_port()
        server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        time.sleep(0.5)
    proxy = None
    try:
        proxy = proxy_bench.start(args.mode, url, console)
        proxy_bench.measure(proxy.url, 4 * args.concurrency, args.concurrency)  # warm up
        store = redis.Redis.from_url(url)
        store.config_resetstat()
        raw = args.raw or Path(tempfile.mkdtemp(prefix="vqg-profile-")) / "stacks.txt"
        spy = subprocess.Popen([py_spy, "record", "--pid", str(proxy.proc.pid), "--subprocesses",
                                "--rate", str(args.rate), "--nonblocking", "--duration", str(args.seconds),
                                "--format", "raw", "--output", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done: dict[str, float] = {}
        sent = [0]

        def load() -> None:
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                r = proxy_bench.measure(proxy.url, 8 * args.concurrency, args.concurrency)
                sent[0] += 8 * args.concurrency + 1 + 2 * args.concurrency
                done["rps"] = r["rps"]

        worker = threading.Thread(target=load)
        worker.start()
        worker.join()
        spy.wait(timeout=args.seconds + 60)
        stats = {k.removeprefix("cmdstat_"): v for k, v in store.info("commandstats").items()}
        store.close()
    finally:
        if proxy is not None:
            proxy.stop()
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
    samples, hooks = categorise(raw.read_text())
    total = sum(samples.values())
    n = sent[0]
    cpu_ms = 1000 * total / args.rate / n
    print(f"{args.mode} proxy, concurrency {args.concurrency}, {n} requests in ~{args.seconds}s "
          f"(last round {done.get('rps', 0):.0f} req/s); py-spy {total} on-CPU samples at "
          f"{args.rate}/s = {cpu_ms:.2f} ms CPU per request\n")
    print("| where | share of proxy CPU | ms CPU per request |")
    print("|---|---|---|")
    for name, _ in CATEGORIES:
        if samples[name]:
            share = samples[name] / total
            print(f"| {name} | {share:.1%} | {share * cpu_ms:.2f} |")
    print("\n| guard entry point | ms CPU per request |")
    print("|---|---|")
    for hook, count in hooks.most_common(8):
        print(f"| {hook} | {count / total * cpu_ms:.2f} |")
    print("\n| Redis command | calls per request | µs per call (server) |")
    print("|---|---|---|")
    for cmd, v in sorted(stats.items(), key=lambda kv: -int(kv[1]["calls"])):
        if cmd in ("config|resetstat", "info", "config"):
            continue
        print(f"| {cmd} | {int(v['calls']) / n:.2f} | {float(v['usec_per_call']):.1f} |")
    print(f"\nstacks: {raw}")


if __name__ == "__main__":
    main()
