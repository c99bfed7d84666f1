"""`volc-quota-guard consume` against the test store and a fake Ark, on the Redis server's clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from volc_quota_guard.cli import main
from volc_quota_guard.clock import ManualClock, beijing_day
from volc_quota_guard.fake import FakeVolcengine
from volc_quota_guard.gate import Gate, Snapshot
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.store import connect

POOL = "default/deepseek-v4-flash-ga-260731"
MIN = 60_000


def dump(client: redis.Redis, prefix: str) -> dict[bytes, Any]:
    """Every key under the prefix with its type and value."""
    out: dict[bytes, Any] = {}
    for key in client.scan_iter(f"{prefix}:*", count=1000):
        kind = client.type(key)
        if kind == b"hash":
            out[key] = client.hgetall(key)
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"set":
            out[key] = client.smembers(key)
        else:
            out[key] = client.get(key)
    return out


@pytest.fixture
def seeded(store_url: str, keyspace: KeySpace, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A pool with a 500k package expiring in 2 h (nothing else), a little traffic today, and a
    week with no natural usage before."""
    monkeypatch.setenv("VQG_REDIS_URL", store_url)
    monkeypatch.setenv("VQG_KEY_PREFIX", keyspace.prefix)
    client = connect(store_url)
    sec, usec = client.time()
    now = int(sec) * 1000 + int(usec) // 1000
    gate = Gate(client, keyspace, ManualClock(now - MIN))
    gate.install_snapshot(POOL, Snapshot(
        balance=500_000, settled_usage=0, expiring=0, small_buffer=50_000, daily_cap=2_000_000,
        valid_until_ms=now + 85 * MIN,
        packages=[{"instance_no": "P1", "available": 500_000, "expires_ms": now + 120 * MIN,
                   "total": 2_000_000}]))
    gate.reserve(POOL, "r1", 1_000)
    gate.settle(POOL, "r1", 800)
    today = beijing_day(now)  # a quiet week: the forecast is 0 whatever the hour
    client.hset(keyspace.consume_history(POOL),
                mapping={"first_day": today - 7, **{f"{today - d}:natural": 0 for d in range(1, 8)}})
    return {"client": client, "prefix": keyspace.prefix}


def test_dry_run_prints_the_plan_and_writes_nothing(seeded, capsys):
    """--dry-run shows plan and reason per pool; every key under the prefix is unchanged."""
    before = dump(seeded["client"], seeded["prefix"])
    assert main(["consume", "--dry-run", "--json"]) == 0
    (out,) = json.loads(capsys.readouterr().out)["pools"]
    assert out["status"] == "planned" and out["consumed"] == 0
    plan = out["plan"]
    # 500k − 800 unsettled would expire; the balance room is 500k − 50k wall − 800 − 50k.
    assert plan["need"] == 499_200 and plan["tokens"] == 500_000 - 50_000 - 800 - 50_000
    assert "P1 expires" in plan["reason"] and "clamped by the balance wall" in plan["reason"]
    assert dump(seeded["client"], seeded["prefix"]) == before
    assert main(["consume", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"{POOL}: plan=399,200 need=499,200" in text and "P1: 499,200 now" in text
    assert dump(seeded["client"], seeded["prefix"]) == before


def test_run_consumes_through_the_gate_once_a_day(seeded, tmp_path: Path, capsys):
    """A real run calls Ark with the config's key, settles into the gate; a second run skips."""
    with FakeVolcengine() as fake:  # account `default`, Ark key `ark-default`
        fake.set_chat_defaults(completion_tokens=10**9)
        fake.add_package(POOL, 500_000)
        config = tmp_path / "litellm.yaml"
        config.write_text(yaml.safe_dump({"model_list": [{
            "model_name": "ds", "litellm_params": {
                "model": f"volcengine/{POOL.split('/')[1]}", "api_base": fake.ark_base_url,
                "api_key": "ark-default"}}]}))
        assert main(["consume", "--config", str(config), "--json"]) == 0
        (first,) = json.loads(capsys.readouterr().out)["pools"]
        assert main(["consume", "--config", str(config), "--json"]) == 0
        (second,) = json.loads(capsys.readouterr().out)["pools"]
        totals = fake.pool_totals(POOL)
        upstream = sum(c.consumed for c in fake.chat_requests())
    assert first["status"] == "done" and 390_000 <= first["consumed"] <= 399_200
    assert first["consumed"] == upstream == totals.consumed and totals.billed == 0
    assert second["status"] == "claimed_elsewhere" and second["consumed"] == 0
    state = Gate(seeded["client"], KeySpace(seeded["prefix"])).status(POOL)
    assert state.get("day_usage") == 800 + first["consumed"] and state.get("inflight") == 0


def test_a_real_run_needs_the_litellm_config(seeded, capsys):
    """Without --config a real run refuses with a clear message (exit 2) and writes nothing."""
    before = dump(seeded["client"], seeded["prefix"])
    assert main(["consume"]) == 2
    assert "--config" in capsys.readouterr().err
    assert dump(seeded["client"], seeded["prefix"]) == before
