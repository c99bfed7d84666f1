"""The `packages` and `fake-volcengine` subcommands, run against a live fake."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from vc_support import ACCOUNTS, POOL_A

from volc_quota_guard.cli import main
from volc_quota_guard.errors import ConfigError
from volc_quota_guard.fake import FakeVolcengine
from volc_quota_guard.fake.config import FakeConfig, build_fake, load_fake_config

HTTP = httpx.Client(timeout=10)  # one client: building one per call costs ~40 ms


@pytest.fixture
def env(fake: FakeVolcengine, monkeypatch: pytest.MonkeyPatch) -> FakeVolcengine:
    """The fake's acct-a keys as the default account and acct-b under its own name."""
    monkeypatch.setenv("VQG_BILLING_ENDPOINT", fake.url)
    monkeypatch.setenv("VOLC_ACCESSKEY", ACCOUNTS["acct-a"][0])
    monkeypatch.setenv("VOLC_SECRETKEY", ACCOUNTS["acct-a"][1])
    monkeypatch.setenv("VOLC_ACCESSKEY_ACCT_B", ACCOUNTS["acct-b"][0])
    monkeypatch.setenv("VOLC_SECRETKEY_ACCT_B", ACCOUNTS["acct-b"][1])
    return fake


def test_packages_json_shows_pools_and_why_the_rest_is_unmatched(
        env: FakeVolcengine, capsys: pytest.CaptureFixture[str]) -> None:
    """`packages --pool … --json` lists every package with its pool or its reason."""
    env.add_package(POOL_A, 2_000_000, available=1_200_000)
    env.add_package(POOL_A, 500_000)
    pool = "default/deepseek-v4-flash-ga-260731"  # acct-a's keys serve as 'default' here
    assert main(["packages", "--pool", pool, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["accounts"]["default"]
    assert out["pools"][pool]["balance"] == 1_700_000
    assert len(out["pools"][pool]["packages"]) == 2
    reasons = {p["configuration_code"]: p["reason"] for p in out["packages"] if not p["pool"]}
    assert "not tokens" in reasons["Doubao_TTS_free_pack"]
    assert "no pool" in reasons["Doubao_Seed3D_1.0_pack_free_infer"]


def test_packages_reads_pools_from_a_litellm_config(
        env: FakeVolcengine, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Pools come from the config's volcengine/ deployments, with vqg_account and
    vqg_packages honoured, and the table names each pool."""
    env.add_package(f"acct-b/{POOL_A.split('/')[1]}", 300_000)
    config = tmp_path / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: fast\n"
        "    litellm_params: {model: volcengine/deepseek-v4-flash-ga-260731}\n"
        "    model_info: {vqg_account: acct-b}\n"
        "  - model_name: code\n"
        "    litellm_params: {model: volcengine/ep-20260101-code}\n"
        "    model_info: {vqg_account: acct-b, vqg_packages: [Doubao_Seed_2.0_code_pack]}\n",
        encoding="utf-8")
    assert main(["packages", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "acct-b/deepseek-v4-flash-ga-260731" in out
    assert "300,000" in out
    assert "acct-b/ep-20260101-code" in out
    assert "has no Effective package" in out  # the code pack is UsedUp
    assert env.api_calls("acct-b") == 1


def test_packages_without_credentials_exits_2_naming_the_variable(
        env: FakeVolcengine, capsys: pytest.CaptureFixture[str]) -> None:
    """An account with no keys in the environment is a clear error, exit status 2."""
    assert main(["packages", "--pool", "team-c/m"]) == 2
    assert "VOLC_ACCESSKEY_TEAM_C" in capsys.readouterr().err


def test_packages_with_a_wrong_secret_exits_2(
        env: FakeVolcengine, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Rejected credentials end the command loudly (exit 2), without printing the secret."""
    monkeypatch.setenv("VOLC_SECRETKEY", "wrong-secret-value")
    assert main(["packages"]) == 2
    captured = capsys.readouterr()
    assert "SignatureDoesNotMatch" in captured.err
    assert "wrong-secret-value" not in captured.err + captured.out


def test_the_fake_config_builds_pools_packages_and_returns(tmp_path: Path) -> None:
    """A YAML fake config sets accounts, pools with relative times, and yesterday's return."""
    path = tmp_path / "fake.yaml"
    path.write_text(
        "start: '2026-08-13T08:00:00+08:00'\n"
        "settlement_lag_minutes: 0\n"
        "accounts: {default: {access_key: AKLTx0000000001, secret_key: s}}\n"
        "pools:\n"
        "  default/doubao-seed-2-1-pro-260628:\n"
        "    yesterday_collection: 1500000\n"
        "    packages:\n"
        "      - {amount: 2000000, available: 1200000, acquired: '-3d'}\n",
        encoding="utf-8")
    fake = build_fake(load_fake_config(path))
    pool = "default/doubao-seed-2-1-pro-260628"
    assert fake.pool_totals(pool).true_balance == 1_200_000
    fake.advance(2 * 3_600_000 + 30 * 60_000)  # 10:30 Beijing
    assert fake.pool_totals(pool).true_balance == 2_700_000
    assert fake.accounts["default"].api_keys == ("ark-default",)
    with pytest.raises(ConfigError):
        build_fake(FakeConfig.model_validate({"start": "yesterday"}))
    path.write_text("pols: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="pols"):
        load_fake_config(path)


def test_the_fake_volcengine_command_serves_until_stopped(tmp_path: Path) -> None:
    """`volc-quota-guard fake-volcengine --port N --package …` answers the admin API."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "volc_quota_guard.cli", "fake-volcengine", "--port", str(port),
         "--scale", "60", "--package", "default/kimi-k2-250905=2_000_000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        state = None
        deadline = time.monotonic() + 30  # startup imports LiteLLM: slow on a loaded machine
        while time.monotonic() < deadline:
            try:
                state = HTTP.get(f"http://127.0.0.1:{port}/_fake/state", timeout=1).json()
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert state is not None
        assert state["pools"]["default/kimi-k2-250905"]["true_balance"] == 2_000_000
        first = state["now_ms"]
        time.sleep(0.2)
        later = HTTP.get(f"http://127.0.0.1:{port}/_fake/clock").json()["now_ms"]
        assert later - first >= 0.2 * 60 * 1000 * 0.9  # the clock runs 60x
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=5)
    assert f"VQG_BILLING_ENDPOINT=http://127.0.0.1:{port}" in out
