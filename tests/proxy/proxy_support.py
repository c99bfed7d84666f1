"""Helpers to run a real `litellm --config …` proxy with the guard, in front of the fake Volcengine.

One proxy per module (startup takes seconds); tests vary the pools by seeding snapshots
through `Gate.install_snapshot`. The proxy's stdout/stderr go to a file the tests read.
Requests carry their own `x-litellm-call-id`, which the guard's log lines repeat.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import redis
import yaml

from volc_quota_guard.fake import FakeVolcengine
from volc_quota_guard.gate import Gate, PoolState, Snapshot
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.proxy.calls import POOL_READ_S

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "config" / "litellm.example.yaml"
LITELLM = Path(os.environ.get("VQG_TEST_LITELLM", Path(sys.executable).parent / "litellm"))
MASTER_KEY = "sk-vqg-test-master"
ACCOUNTS = {"acct-a": ("AK-a", "SK-a"), "acct-b": ("AK-b", "SK-b"), "acct-c": ("AK-c", "SK-c")}
DS = "deepseek-v4-flash-ga-260731"
POOL_A = f"acct-a/{DS}"
POOL_B = f"acct-b/{DS}"
POOL_DOUBAO = "acct-a/doubao-seed-2-1-pro-260628"
POOL_SOLO = "acct-c/solo-model-260101"
POOL_NOSNAP = "acct-c/nosnap-model-260101"
BIG = 1_000_000_000
READY = "Application startup complete."  # uvicorn, once per worker process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_config(fake_url: str, closed_port: int) -> dict[str, Any]:
    """The example config plus test-only deployments (one per behaviour under test)."""
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    ark = "os.environ/VOLCENGINE_API_BASE"
    config["model_list"] += [
        {"model_name": "solo",  # one deployment, no fallback: a refusal reaches the client
         "litellm_params": {"model": "volcengine/solo-model-260101", "api_base": ark,
                            "api_key": "os.environ/ARK_API_KEY_ACCT_C"},
         "model_info": {"id": "solo@acct-c", "vqg_account": "acct-c", "max_output_tokens": 4096,
                        "vqg_reasoning_tokens": 0}},  # a model without deep thinking
        {"model_name": "nosnap",  # a pool that never had a snapshot
         "litellm_params": {"model": "volcengine/nosnap-model-260101", "api_base": ark,
                            "api_key": "os.environ/ARK_API_KEY_ACCT_C"},
         "model_info": {"id": "nosnap@acct-c", "vqg_account": "acct-c"}},
        {"model_name": "optout",  # the operator's opt-out
         "litellm_params": {"model": "volcengine/optout-model-260101", "api_base": ark,
                            "api_key": "os.environ/ARK_API_KEY_ACCT_C"},
         "model_info": {"id": "optout@acct-c", "vqg_account": "acct-c", "vqg_guard": False}},
        {"model_name": "other-provider",  # not Volcengine: never guarded
         "litellm_params": {"model": "openai/gpt-fake", "api_base": f"{fake_url}/v1",
                            "api_key": "os.environ/ARK_API_KEY_ACCT_C"},
         "model_info": {"id": "other@fake"}},
        {"model_name": "unreachable",  # connection refused: nothing reached the upstream
         "litellm_params": {"model": "volcengine/solo-model-260101",
                            "api_base": f"http://127.0.0.1:{closed_port}/api/v3",
                            "api_key": "os.environ/ARK_API_KEY_ACCT_C"},
         "model_info": {"id": "unreachable@acct-c", "vqg_account": "acct-c"}},
    ]
    config.setdefault("router_settings", {})["model_group_alias"] = {"ds-alias": "deepseek-v4-flash"}
    return config


@dataclass
class Proxy:
    """A running proxy subprocess and the handles tests need."""

    url: str
    log_path: Path
    process: subprocess.Popen[bytes]
    gate: Gate
    fake: FakeVolcengine

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=MASTER_KEY, max_retries=0,
                             timeout=60, **kw)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: str, count: int = 1, timeout: float = 20) -> list[str]:
        """Lines matching `pattern` (regex), once at least `count` of them have appeared."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            found = [ln for ln in self.log().splitlines() if rx.search(ln)]
            if len(found) >= count or time.monotonic() > deadline:
                assert len(found) >= count, f"no {count}x /{pattern}/ in the proxy log:\n" + \
                    "\n".join(self.log().splitlines()[-40:])
                return found
            time.sleep(0.05)

    def state(self, pool: str) -> PoolState:
        return self.gate.status(pool)

    def seed(self, pool: str, headroom: int, daily_headroom: int = BIG,
             evict_below: int = 1_000, ladder: tuple[tuple[int, int], ...] = ()) -> None:
        """Give `pool` exactly `headroom` tokens under the balance wall (counters are kept);
        `ladder`: packages expiring later, (expires at ms, free tokens) in the headroom."""
        deadline = time.monotonic() + 20
        while (st := self.gate.status(pool)).get("inflight") and time.monotonic() < deadline:
            time.sleep(0.05)  # the previous test's last settle is still on its way
        assert st.get("inflight") == 0, f"{pool} has reservations in flight: {st.fields}"
        ucum, today = st.get("ucum"), st.get("day_usage")
        self.gate.install_snapshot(pool, Snapshot(
            balance=headroom, settled_usage=ucum, expiring=0, small_buffer=0,
            daily_cap=today + daily_headroom, valid_until_ms=int(time.time() * 1000) + 3_600_000,
            evict_below=evict_below, ladder=ladder))
        if min(headroom, daily_headroom) < evict_below:
            # An eviction by another process reaches the proxy's routing within POOL_READ_S (its
            # reserve refuses what does not fit at once; a request that fits may still be served).
            time.sleep(POOL_READ_S)


IDLE_ACCOUNT_ADMIT = "1000000000"  # VQG_COLD_START_ADMIT_TOKENS for an account with no prior usage


def sync_env(fake: FakeVolcengine, **extra: str) -> dict[str, str]:
    """Proxy env for a running billing sync against the fake: fast polls, every account's keys."""
    env = {"VQG_SYNC_ENABLED": "true", "VQG_SYNC_POLL_SECONDS": "0.2",
           "VQG_BILLING_ENDPOINT": fake.url, "VQG_SMALL_BUFFER": "5000",
           # The fake's accounts had no usage before the test: the first sync may serve at once,
           # and nothing ran unseen (tests/faults/test_state_faults.py tests the production values).
           "VQG_COLD_START_ADMIT_TOKENS": IDLE_ACCOUNT_ADMIT, "VQG_UNSEEN_DAY_TOKENS": "0", **extra}
    for account, (ak, sk) in ACCOUNTS.items():
        suffix = account.upper().replace("-", "_")
        env |= {f"VOLC_ACCESSKEY_{suffix}": ak, f"VOLC_SECRETKEY_{suffix}": sk}
    return env


def call_id() -> str:
    return f"vqgtest-{uuid.uuid4().hex}"


def start_proxy(tmp: Path, fake: FakeVolcengine, store_url: str, prefix: str,
                env: dict[str, str] | None = None, args: tuple[str, ...] = (),
                config: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Proxy:
    """Start `litellm --config` on a free port and wait until it answers."""
    workers = int(args[args.index("--num_workers") + 1]) if "--num_workers" in args else 1
    data = build_config(fake.url, free_port())
    if config is not None:
        data = config(data)
    cfg = tmp / "litellm.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    log_path = tmp / "proxy.log"
    port = free_port()
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith(("VQG_", "VOLC_", "LITELLM_")) and k not in ("REDIS_URL",)}
    child_env.update({
        "LITELLM_MASTER_KEY": MASTER_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "VQG_REDIS_URL": store_url, "VQG_KEY_PREFIX": prefix,
        "VOLCENGINE_API_BASE": fake.ark_base_url, "ARK_API_KEY_ACCT_A": "ark-acct-a",
        "ARK_API_KEY_ACCT_B": "ark-acct-b", "ARK_API_KEY_ACCT_C": "ark-acct-c",
        "PYTHONUNBUFFERED": "1",
        "VQG_SYNC_ENABLED": "false",  # tests seed snapshots by hand; test_proxy_sync turns it on
    })
    child_env.update(env or {})
    with log_path.open("wb") as out:
        process = subprocess.Popen([str(LITELLM), "--config", str(cfg), "--host", "127.0.0.1",
                                    "--port", str(port), *args],
                                   env=child_env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"proxy exited ({process.returncode}):\n{log_path.read_text()[-4000:]}")
        try:
            up = httpx.get(f"{url}/health/liveliness", timeout=2).status_code == 200
        except httpx.HTTPError:
            up = False
        if up and log_path.read_text(errors="replace").count(READY) >= workers:
            break  # every worker process is serving
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"proxy did not start:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.2)
    gate = Gate(redis.Redis.from_url(store_url), KeySpace(prefix))
    return Proxy(url, log_path, process, gate, fake)


def stop_proxy(proxy: Proxy) -> None:
    proxy.process.terminate()
    try:
        proxy.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proxy.process.kill()
        proxy.process.wait(timeout=5)




def ark_deployment(model_name: str, pool: str, **info: Any) -> dict[str, Any]:
    """A guarded deployment of `pool` (an acct-c model) on the fake Ark, for a test's config."""
    account, model = pool.split("/")
    return {"model_name": model_name,
            "litellm_params": {"model": f"volcengine/{model}", "api_base": "os.environ/VOLCENGINE_API_BASE",
                               "api_key": f"os.environ/ARK_API_KEY_{account.upper().replace('-', '_')}"},
            "model_info": {"id": f"{model_name}@{account}", "vqg_account": account, **info}}


def start_syncing_proxy(tmp: Path, fake: FakeVolcengine, store_url: str, prefix: str,
                        pools: dict[str, int], deployments: list[dict[str, Any]],
                        **env: str) -> Proxy:
    """A proxy whose only source of truth is the fake's billing API: each pool gets a package of
    its free tokens, the extra deployments join the config, and it returns once each pool synced."""
    for pool, free in pools.items():
        fake.add_package(pool, free)

    def config(data: dict[str, Any]) -> dict[str, Any]:
        data["model_list"] += deployments
        return data

    proxy = start_proxy(tmp, fake, store_url, prefix, env=sync_env(fake, **env), config=config)
    for pool, free in pools.items():
        proxy.wait_for_log(rf"\[Sync\] {pool}: Bal={free:,}")
    return proxy
