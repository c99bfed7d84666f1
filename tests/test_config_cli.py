"""Settings validation and the `snapshot` command, through their real entry points."""

from __future__ import annotations

import pytest

from backend import TEST_REDIS_URL
from volc_quota_guard.cli import main
from volc_quota_guard.config import load_settings
from volc_quota_guard.errors import ConfigError
from volc_quota_guard.gate import Gate
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.store import connect


def test_defaults_match_the_design(monkeypatch):
    """With nothing set, the documented defaults apply (buffer 50k, cap 2M, floor 20, closed)."""
    s = load_settings()
    assert (s.small_buffer, s.daily_cap, s.lag_floor_minutes, s.fail_mode, s.redis_url) == (
        50_000, 2_000_000, 20, "closed", None)


def test_legacy_names_are_accepted(monkeypatch):
    """SMALL_BUFFER and REDIS_URL (the seed's names) work when the VQG_ ones are unset."""
    monkeypatch.setenv("SMALL_BUFFER", "70000")
    monkeypatch.setenv("REDIS_URL", "redis://example:6379/3")
    s = load_settings()
    assert (s.small_buffer, s.redis_url) == (70_000, "redis://example:6379/3")
    monkeypatch.setenv("VQG_REDIS_URL", "redis://other:6379/0")
    assert load_settings().redis_url == "redis://other:6379/0"


@pytest.mark.parametrize(("name", "value", "needle"), [
    ("VQG_SMALL_BUFFER", "-1", "VQG_SMALL_BUFFER='-1' is invalid: must be an integer from 0 to 10,000,000"),
    ("VQG_DAILY_CAP", "lots", "VQG_DAILY_CAP='lots' is invalid"),
    ("VQG_LAG_FLOOR_MINUTES", "0", "from 1 to 1,440"),
    ("VQG_FAIL_MODE", "maybe", "'closed' or 'open'"),
    ("VQG_KEY_PREFIX", "a{b}", "VQG_KEY_PREFIX"),
    ("VQG_CONSUME_AT", "24:00", "VQG_CONSUME_AT='24:00' is invalid: must be a Beijing time HH:MM"),
    ("VQG_CONSUME_CALL_TOKENS", "10", "VQG_CONSUME_CALL_TOKENS='10' is invalid: must be an integer from 1,"),
    ("VQG_CONSUME_TIMEOUT_SECONDS", "0", "must be a number from 1 to 3,600"),
    ("VQG_CONSUME_ENABLED", "maybe", "VQG_CONSUME_ENABLED='maybe' is invalid: must be true or false"),
])
def test_bad_values_stop_startup_naming_the_variable(monkeypatch, name, value, needle):
    """A bad value raises ConfigError whose message names the variable and its allowed range."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=None) as exc:
        load_settings()
    assert needle in str(exc.value)


def test_a_daily_cap_above_volcengines_is_started_with_a_warning(monkeypatch, caplog):
    """VQG_DAILY_CAP above the 2M cap last seen at Volcengine (a red-team note, stop 35) starts,
    since an account's cap may be higher, but says what it risks; the default says nothing."""
    assert load_settings().daily_cap == 2_000_000
    assert "VQG_DAILY_CAP" not in caplog.text
    monkeypatch.setenv("VQG_DAILY_CAP", "3000000")
    assert load_settings().daily_cap == 3_000_000
    assert "⚠️ [CONFIG] VQG_DAILY_CAP=3,000,000 is above the 2,000,000" in caplog.text


def test_snapshot_command_installs_a_pool(monkeypatch, keyspace, capsys):
    """`volc-quota-guard snapshot` seeds a pool so the gate admits against it."""
    if TEST_REDIS_URL:
        monkeypatch.setenv("VQG_REDIS_URL", TEST_REDIS_URL)
    monkeypatch.setenv("VQG_KEY_PREFIX", keyspace.prefix)
    monkeypatch.setenv("VQG_SMALL_BUFFER", "1000")
    assert main(["snapshot", "acct-a/model-x", "--balance", "50000"]) == 0
    assert "balance wall 49,000" in capsys.readouterr().out
    gate = Gate(connect(TEST_REDIS_URL), KeySpace(keyspace.prefix))
    assert gate.reserve("acct-a/model-x", "r", 60_000, least=1).amount == 49_000


def test_snapshot_command_rejects_a_bad_pool(capsys):
    """A pool id that is not account/model is refused by the parser with a message."""
    with pytest.raises(SystemExit) as exc:
        main(["snapshot", "no-slash", "--balance", "1"])
    assert exc.value.code == 2
    assert "bad pool id" in capsys.readouterr().err
