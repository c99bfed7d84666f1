"""Redis ACL and TLS URLs work, and no secret (billing keys, API keys, the Redis password) reaches
a log line, an error, the CLI's output or the metrics."""

from __future__ import annotations

import asyncio
import types
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from secure_redis import ACL_USER, REDIS_PASSWORD, RedisServer, free_port, make_tls_files, start_redis

from volc_quota_guard import cli
from volc_quota_guard.config import load_settings
from volc_quota_guard.errors import StoreUnavailable
from volc_quota_guard.fake import FakeVolcengine
from volc_quota_guard.gate import AsyncGate, Gate, Snapshot
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.store import connect, connect_async
from volc_quota_guard.proxy.hook import QuotaGuard
from volc_quota_guard.proxy.refusals import QuotaStoreDown
from volc_quota_guard.sync import SyncService
from volc_quota_guard.volcengine.packages import PoolSpec

POOL = "acct-a/deepseek-v4-flash-ga-260731"
ACCESS_KEY = "AKLTvqgLeakCheckAccess0001"
SECRET_KEY = "vqgLeakCheckSecret+5f4e3d2c=="
REAL_SECRET = "vqgLeakCheckRealSecret+0000"  # what the fake billing API expects instead
API_KEY = "ark-vqgLeakCheckApiKey-4242"
SECRETS = (ACCESS_KEY, SECRET_KEY, REAL_SECRET, API_KEY, REDIS_PASSWORD)


def _exercise_gate(url: str) -> None:
    """Snapshot, reserve and settle through sync and asyncio clients on `url`."""
    ks = KeySpace(f"vqgtest-sec-{uuid.uuid4().hex[:8]}")
    gate = Gate(connect(url), ks)
    gate.install_snapshot(POOL, Snapshot(100_000, 0, 0, 0, 1_000_000, gate.now_ms() + 600_000, 0))
    assert gate.reserve(POOL, "r1", 5_000).admitted
    assert gate.settle(POOL, "r1", 3_000).amount == 3_000

    async def main() -> None:
        agate = AsyncGate(connect_async(url), ks)
        assert (await agate.reserve(POOL, "r2", 5_000)).admitted
        assert (await agate.settle(POOL, "r2", 2_000)).amount == 2_000
        await agate.client.aclose()

    asyncio.run(main())
    assert gate.status(POOL).get("ucum") == 5_000


def test_gate_works_through_an_acl_user_and_password(acl_redis: RedisServer) -> None:
    """`redis://user:pass@host/0` reaches a server whose default user is off; a wrong password
    fails as StoreUnavailable whose message does not repeat the password."""
    assert f"{ACL_USER}:{REDIS_PASSWORD}@" in acl_redis.url
    _exercise_gate(acl_redis.url)
    wrong = acl_redis.url.replace(REDIS_PASSWORD, "vqgWrongPw-0000")
    with pytest.raises(StoreUnavailable) as err:
        Gate(connect(wrong)).status(POOL)
    assert "vqgWrongPw-0000" not in str(err.value) and REDIS_PASSWORD not in str(err.value)


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A TLS-only redis-server (throwaway CA) with the ACL user."""
    try:
        files = make_tls_files(tmp_path)
        server = start_redis(tmp_path, REDIS_PASSWORD, tls=files)
    except FileNotFoundError as exc:
        pytest.skip(f"platform limit: no {exc} binary on PATH")
    except RuntimeError as exc:
        if "tls" in str(exc).lower() and ("bad directive" in str(exc).lower() or "not" in str(exc)):
            pytest.skip("platform limit: this redis-server was built without TLS support")
        raise
    yield server
    server.stop()


def test_gate_and_status_work_over_tls(tls_redis: RedisServer, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`rediss://user:pass@host/0?ssl_ca_certs=…` works for the gate (sync and asyncio) and the
    status command, and the status output does not show the password."""
    assert tls_redis.url.startswith("rediss://")
    _exercise_gate(tls_redis.url)
    monkeypatch.setenv("VQG_REDIS_URL", tls_redis.url)
    assert cli.main(["status", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"key_prefix"' in out and REDIS_PASSWORD not in out


def test_store_errors_never_carry_url_credentials() -> None:
    """A StoreUnavailable built from text that contains a Redis URL shows it without user:password."""
    err = StoreUnavailable(f"cannot use rediss://{ACL_USER}:{REDIS_PASSWORD}@10.0.0.1:6380/0 now")
    assert REDIS_PASSWORD not in str(err) and "rediss://***@10.0.0.1:6380/0" in str(err)


def test_no_secret_in_logs_errors_cli_or_metrics(acl_redis: RedisServer, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Sync with rejected billing credentials, the hook with an unreachable password-protected
    store, and the status / metrics / packages commands print nothing secret."""
    caplog.set_level("DEBUG")
    prefix = f"vqgtest-leak-{uuid.uuid4().hex[:8]}"
    closed = f"redis://{ACL_USER}:{REDIS_PASSWORD}@127.0.0.1:{free_port()}/0"
    errors: list[str] = []
    with FakeVolcengine({"acct-a": (ACCESS_KEY, REAL_SECRET, API_KEY)}) as fake:
        monkeypatch.setenv("VOLC_ACCESSKEY_ACCT_A", ACCESS_KEY)
        monkeypatch.setenv("VOLC_SECRETKEY_ACCT_A", SECRET_KEY)
        monkeypatch.setenv("VQG_BILLING_ENDPOINT", fake.url)
        monkeypatch.setenv("VQG_REDIS_URL", acl_redis.url)
        monkeypatch.setenv("VQG_KEY_PREFIX", prefix)
        cfg = load_settings()
        gate = Gate(connect(cfg.redis_url), KeySpace(prefix))
        gate.install_snapshot(POOL, Snapshot(100_000, 0, 0, 0, 1_000_000, gate.now_ms() + 600_000, 0))
        sync = SyncService(cfg, gate, lambda: [PoolSpec(POOL)])
        [outcome] = sync.tick()
        assert outcome.error and "BillingAuthError" in outcome.error
        errors.append(outcome.error)

        monkeypatch.setenv("VQG_REDIS_URL", closed)
        guard = QuotaGuard(load_settings())
        kwargs = {"model": "volcengine/deepseek-v4-flash-ga-260731", "api_key": API_KEY,
                  "messages": [{"role": "user", "content": "hi"}], "litellm_call_id": "c1",
                  "litellm_logging_obj": types.SimpleNamespace(),
                  "litellm_params": {"api_key": API_KEY},
                  "metadata": {"model_info": {"id": "d1", "vqg_account": "acct-a"}, "model_group": "g"}}
        with pytest.raises(QuotaStoreDown) as down:
            asyncio.run(guard.async_pre_call_deployment_hook(kwargs, "acompletion"))
        errors.append(str(down.value))
        monkeypatch.setenv("VQG_REDIS_URL", acl_redis.url)

        codes = {" ".join(argv): cli.main(argv) for argv in (
            ["status"], ["status", "--json"], ["metrics"], ["packages", "--account", "acct-a"],
            ["packages", "--pool", POOL, "--json"])}
        monkeypatch.setenv("VQG_REDIS_URL", closed)
        codes["metrics (store down)"] = cli.main(["metrics"])
        codes["status (store down)"] = cli.main(["status"])
    out = capsys.readouterr()
    assert codes == {"status": 0, "status --json": 0, "metrics": 0, "packages --account acct-a": 2,
                     f"packages --pool {POOL} --json": 2, "metrics (store down)": 1,
                     "status (store down)": 2}, codes
    assert "vqg_store_up 1.0" in out.out and "vqg_store_up 0.0" in out.out  # both scrapes printed
    assert "BillingAuthError" in caplog.text and "STORE-DOWN" in caplog.text  # the paths ran
    produced = {"logs": caplog.text, "stdout": out.out, "stderr": out.err, "errors": "\n".join(errors)}
    for where, text in produced.items():
        leaked = [s for s in SECRETS if s in text]
        assert not leaked, f"{where} shows {leaked}:\n{text[-3000:]}"
    client = connect(acl_redis.url)
    for key in client.scan_iter(f"{prefix}:*", count=1000):
        client.delete(key)
