"""A proxy with the metrics endpoint on, its store behind an ACL password, billing credentials
and Ark keys set to known fake secrets: the endpoint and `volc-quota-guard metrics` report what
the traffic did, and no secret appears in anything the proxy or the CLI printed."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from proxy_support import POOL_A, POOL_SOLO, Proxy, call_id, free_port, start_proxy, stop_proxy
from secure_redis import REDIS_PASSWORD, RedisServer

from volc_quota_guard.fake import ChatDefaults, FakeVolcengine

pytestmark = pytest.mark.proxy

SECRETS = {
    "acct-a": ("AKLTvqgSecretAccessA0001", "vqgSecretKeyA+9f8e7d6c==", "ark-vqgSecretApiKeyA-77"),
    "acct-b": ("AKLTvqgSecretAccessB0002", "vqgSecretKeyB+real00001", "ark-vqgSecretApiKeyB-88"),
    "acct-c": ("AKLTvqgSecretAccessC0003", "vqgSecretKeyC+4a3b2c1d==", "ark-vqgSecretApiKeyC-99"),
}
WRONG_SECRET_B = "vqgSecretKeyB+WRONG9999"  # acct-b's configured secret: the billing API refuses it
ALL_SECRETS = [s for triple in SECRETS.values() for s in triple] + [WRONG_SECRET_B, REDIS_PASSWORD]


def scrape(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(sample name, labels): value} of a Prometheus exposition."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: dict, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    found = [v for (n, lab), v in samples.items() if n == name and want <= lab]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory, acl_redis: RedisServer) -> Iterator[Proxy]:
    """A proxy syncing from the fake billing API (acct-b with a wrong secret key), serving
    /metrics on a free port, its store the ACL-protected redis-server."""
    fake = FakeVolcengine(SECRETS, chat_defaults=ChatDefaults(completion_tokens=64)).start()
    fake.add_package(POOL_A, 500_000)
    fake.add_package(POOL_SOLO, 1_000_000)
    prefix = f"vqgtest-metrics-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {"VQG_SYNC_ENABLED": "true", "VQG_SYNC_POLL_SECONDS": "0.2", "VQG_BILLING_ENDPOINT": fake.url,
           "VQG_METRICS_PORT": str(port),
           "VQG_COLD_START_ADMIT_TOKENS": "1000000000"}  # an idle account: no cold-start hold
    for account, (ak, sk, ark) in SECRETS.items():
        suffix = account.upper().replace("-", "_")
        env |= {f"VOLC_ACCESSKEY_{suffix}": ak, f"ARK_API_KEY_{suffix}": ark,
                f"VOLC_SECRETKEY_{suffix}": WRONG_SECRET_B if account == "acct-b" else sk}
    p = start_proxy(tmp_path_factory.mktemp("metrics"), fake, acl_redis.url, prefix, env=env)
    p.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
    p.env = {**env, "VQG_REDIS_URL": acl_redis.url, "VQG_KEY_PREFIX": prefix}  # type: ignore[attr-defined]
    yield p
    stop_proxy(p)
    fake.stop()
    client = redis.Redis.from_url(acl_redis.url)
    for key in client.scan_iter(f"{prefix}:*", count=1000):
        client.delete(key)


def _cli(proxy: Proxy, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VQG_", "VOLC_"))}
    env |= proxy.env  # type: ignore[attr-defined]
    return subprocess.run([sys.executable, "-m", "volc_quota_guard.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def _ask(proxy: Proxy, max_tokens: int) -> None:
    proxy.client().chat.completions.create(
        model="solo", max_tokens=max_tokens, extra_headers={"x-litellm-call-id": call_id()},
        messages=[{"role": "user", "content": "[[fake prompt=500 completion=100]] hi"}])


def test_endpoint_and_cli_report_the_traffic_and_no_secret_leaks(metered: Proxy, tmp_path: Path) -> None:
    """After a served, a clamped (evicting) and a refused request, the scrape shows the pool's
    usage, walls and counters, the sync's balance and failure, the CLI prints the same gauges,
    and no credential, API key or Redis password appears in any output."""
    metered.wait_for_log(rf"\[Sync\] {POOL_SOLO}: Bal=1,000,000")
    metered.wait_for_log(rf"\[Sync\] {POOL_A}: Bal=500,000")
    metered.wait_for_log(r"\[Sync\] acct-b: billing API failed \(BillingAuthError")
    metered.seed(POOL_SOLO, 3_000, evict_below=1_000)
    _ask(metered, 1_000)  # admitted whole: 600 tokens used
    _ask(metered, 4_000)  # clamped to the 2,400 left, which evicts the pool until it settles
    metered.seed(POOL_SOLO, 100, evict_below=0)
    with pytest.raises(openai.RateLimitError):
        _ask(metered, 500)
    metered.wait_for_log(r"\[Usage\] solo-model-260101", count=2)

    text = httpx.get(metered.metrics_url, timeout=10).text  # type: ignore[attr-defined]
    m = scrape(text)
    solo = {"pool": POOL_SOLO, "account": "acct-c", "model": "solo-model-260101"}
    state = metered.state(POOL_SOLO)
    assert value(m, "vqg_store_up") == 1
    assert value(m, "vqg_usage_today_tokens", **solo) == 1_200
    assert value(m, "vqg_lifetime_usage_tokens", **solo) == 1_200
    assert value(m, "vqg_inflight_tokens", **solo) == 0
    assert value(m, "vqg_wall_limit_tokens", wall="balance", **solo) == state.decision.balance_wall == 1_300
    assert value(m, "vqg_headroom_tokens", **solo) == 100
    assert value(m, "vqg_balance_at_sync_tokens", **solo) == 100  # the hand-seeded snapshot
    assert value(m, "vqg_balance_at_sync_tokens", pool=POOL_A) == 500_000  # the sync's
    assert value(m, "vqg_clamps_total", **{"pool": POOL_SOLO}) == 1
    assert value(m, "vqg_evictions_total", pool=POOL_SOLO) == 1
    assert value(m, "vqg_blocks_total", pool=POOL_SOLO, reason="balance_wall") == 1
    assert value(m, "vqg_sync_errors_total", account="acct-b", kind="BillingAuthError") >= 1
    assert value(m, "vqg_evicted", **solo) == 0 and value(m, "vqg_overruns_total", **solo) == 0
    assert value(m, "vqg_sync_age_seconds", pool=POOL_A) >= 0

    cli = _cli(metered, "metrics")
    assert cli.returncode == 0, cli.stderr
    once = scrape(cli.stdout)
    assert value(once, "vqg_usage_today_tokens", **solo) == 1_200
    assert value(once, "vqg_balance_at_sync_tokens", pool=POOL_A) == 500_000
    assert value(once, "vqg_clamps_total", pool=POOL_SOLO) is None  # per-process: the proxy's only
    status = _cli(metered, "status")
    status_json = _cli(metered, "status", "--json")
    assert status.returncode == status_json.returncode == 0, status.stderr + status_json.stderr

    produced = {"proxy log": metered.log(), "scrape": text, "metrics CLI": cli.stdout + cli.stderr,
                "status": status.stdout + status.stderr, "status --json": status_json.stdout}
    for where, out in produced.items():
        leaked = [s for s in ALL_SECRETS if s in out]
        assert not leaked, f"{where} shows {leaked}"
    assert "BillingAuthError" in produced["status"] + produced["proxy log"]  # the output is real
