"""`volc-quota-guard simulate` through the CLI entry point: deterministic, JSON as documented."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from volc_quota_guard.cli import main

TINY = """\
version: 1
name: cli-tiny
start: 2026-08-13T00:00:00+08:00
days: 1
settlement_lag_minutes: 14
sync_interval_minutes: 10
packages:
  - {amount: 400000, acquired: 2026-08-01T09:00:00+08:00}
traffic:
  - {from: "09:00", to: "11:00", every_seconds: 60, concurrency: 2,
     prompt: 2000, completion: 600, max_tokens: 1024}
"""


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> object:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    """The same shipped scenario run twice through the CLI prints byte-identical JSON."""
    argv = ["simulate", "seed-0812-2053-big-request", "--strategy", "all", "--json"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first
    objs = json.loads(first)
    assert [o["strategy"] for o in objs] == ["guard", "v2", "v4", "v5", "v6"]


def test_one_strategy_prints_one_object(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """With one strategy the output is a single JSON object, as SCENARIOS.md says."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    obj = _json(capsys, ["simulate", str(path), "--json"])
    assert isinstance(obj, dict)
    assert (obj["scenario"], obj["strategy"], obj["billed_tokens"]) == ("cli-tiny", "guard", 0)


def test_a_bad_scenario_exits_2_naming_the_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An invalid file stops the command with exit code 2 and `file:line: key: problem`."""
    path = tmp_path / "bad.yaml"
    path.write_text(TINY.replace("concurrency: 2", "concurency: 2"))
    assert main(["simulate", str(path)]) == 2
    assert f"{path}:10: traffic[0].concurency: unknown key" in capsys.readouterr().err


def test_the_human_table_names_every_strategy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Without --json a table shows one row per strategy with the billed column."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    assert main(["simulate", str(path), "--strategy", "guard,v6"]) == 0
    out = capsys.readouterr().out
    assert "cli-tiny" in out and "billed" in out
    assert " guard " in out and " v6 " in out


def test_plot_without_matplotlib_says_how_to_get_it(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """--plot fails fast with an install hint when matplotlib is missing (it is optional)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    assert main(["simulate", str(path), "--plot", str(tmp_path / "p.png")]) == 2
    assert "pip install matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


def test_plot_draws_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """With matplotlib installed, --plot writes a PNG of the run."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    out = tmp_path / "p.png"
    assert main(["simulate", str(path), "--strategy", "guard,v6", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_list_shows_the_shipped_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    """--list prints every shipped scenario with its description."""
    assert main(["simulate", "--list"]) == 0
    out = capsys.readouterr().out
    assert "seed-0813-lag-below-cap" in out and "low-usage-month" in out


def test_an_unknown_strategy_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse rejects a strategy that does not exist, naming the valid ones."""
    with pytest.raises(SystemExit) as info:
        main(["simulate", "seed-0813-lag", "--strategy", "v7"])
    assert info.value.code == 2
    assert "guard, v2, v4, v5, v6" in capsys.readouterr().err
