"""The scenario file format (shared/SCENARIOS.md v1): strict, line-aware, and expanded as written."""

from __future__ import annotations

import pytest

from volc_quota_guard.clock import BEIJING, MS_PER_DAY
from volc_quota_guard.simulator import ScenarioError, builtin_names, load_scenario, parse_scenario
from volc_quota_guard.simulator.scenario import arrivals, description

GOOD = """\
version: 1
name: tiny
start: 2026-08-13T00:00:00+08:00
days: 1
return_at: 10:30
packages:
  - {amount: 1000000, acquired: 2026-08-01T09:00:00+08:00}
traffic:
  - {from: "09:00", to: "09:02", every_seconds: 30, concurrency: 2, prompt: 100, completion: 50}
  - {at: "20:53", prompt: 1000, completion: 176571}
"""


def _error(text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "s.yaml")
    return str(info.value)


def test_a_valid_scenario_parses_with_the_documented_defaults() -> None:
    """Omitted keys take SCENARIOS.md's defaults, and an unquoted 10:30 stays a time of day."""
    s = parse_scenario(GOOD)
    assert (s.daily_cap, s.settlement_lag_minutes, s.small_buffer) == (2_000_000, 14, 50_000)
    assert s.return_at == (10 * 60 + 30) * 60_000
    line = s.traffic[0]
    assert (line.estimate_ratio, line.duration_seconds, line.max_tokens, line.usage) == (1.0, 20, None, None)
    assert s.start.utcoffset() == BEIJING.utcoffset(None)


def test_an_unknown_key_is_rejected_with_its_line() -> None:
    """A typo such as `evry_seconds` names the file, the line and the key instead of being ignored."""
    msg = _error(GOOD.replace("every_seconds: 30", "evry_seconds: 30"))
    assert "s.yaml:9:" in msg
    assert "traffic[0].evry_seconds: unknown key" in msg


def test_an_unknown_top_level_key_is_rejected_with_its_line() -> None:
    """An unknown top-level key is reported on the line where it is written."""
    msg = _error(GOOD.replace("days: 1\n", "days: 1\nlag_minutes: 14\n"))
    assert msg.startswith("s.yaml:5: lag_minutes: unknown key")


@pytest.mark.parametrize(("bad", "needle"), [
    ('to: "09:02"', 'to: "25:00"'),
    ('to: "09:02"', 'to: "9am"'),
    ('at: "20:53"', 'at: "20:60"'),
])
def test_a_bad_time_of_day_is_rejected_with_its_line(bad: str, needle: str) -> None:
    """A time of day that is not HH:MM within the day is an error naming the line and the value."""
    msg = _error(GOOD.replace(bad, needle))
    line = 9 if "to" in needle else 10
    assert msg.startswith(f"s.yaml:{line}: traffic[")
    assert "bad time of day" in msg


def test_a_start_without_an_offset_is_rejected_with_its_line() -> None:
    """`start` must carry its UTC offset, since the whole run is in Beijing time."""
    msg = _error(GOOD.replace("2026-08-13T00:00:00+08:00", "2026-08-13T00:00:00"))
    assert msg.startswith("s.yaml:3: start: time '2026-08-13T00:00:00' needs an offset")


def test_an_unparseable_instant_is_rejected_with_its_line() -> None:
    """A package time that is not ISO 8601 is reported on the package's line."""
    msg = _error(GOOD.replace("acquired: 2026-08-01T09:00:00+08:00", "acquired: last tuesday"))
    assert msg.startswith("s.yaml:7: packages[0].acquired: bad time 'last tuesday'")


def test_a_duplicate_key_is_rejected_with_its_line() -> None:
    """YAML would silently keep the last of two equal keys; the loader refuses instead."""
    msg = _error(GOOD.replace("days: 1\n", "days: 1\ndays: 2\n"))
    assert msg.startswith("s.yaml:5: days: duplicate key")


@pytest.mark.parametrize(("old", "new", "needle"), [
    ('{at: "20:53",', '{at: "20:53", from: "09:00",', "either `at` or `from`"),
    ('every_seconds: 30, ', "", "missing: every_seconds"),
    ("prompt: 100,", 'prompt: "100",', "traffic[0].prompt: Input should be a valid integer"),
    ("prompt: 1000,", "prompt: 1000, usage: absent,", "traffic[1].usage"),
    ("prompt: 1000,", "prompt: 1000, day: 3,", "day 3 is after the run's last day (1)"),
    ("version: 1", "version: 2", "version: Input should be 1"),
    ("prompt: 1000,", "prompt: 1000, exact_ratio: 0.9,", "only for `counting: ark-api`"),
    ("prompt: 1000,", "prompt: 1000, counting: doubao,", "traffic[1].counting"),
])
def test_inconsistent_lines_are_rejected(old: str, new: str, needle: str) -> None:
    """Wrong shapes, types, enum values and days outside the run are errors, not defaults."""
    assert needle in _error(GOOD.replace(old, new, 1))


def test_broken_yaml_names_the_line() -> None:
    """A YAML syntax error is reported with its line too."""
    msg = _error(GOOD.replace("days: 1", "days: [1"))
    assert msg.startswith("s.yaml:")
    assert "not valid YAML" in msg


def test_arrivals_follow_every_concurrency_and_single_times() -> None:
    """A steady line starts `concurrency` requests every `every_seconds` in [from, to); `at` once."""
    s = parse_scenario(GOOD)
    got = [(a.at_ms - s.start_ms, a.line, a.count) for a in arrivals(s)]
    h = 3_600_000
    assert got == [(9 * h, 0, 2), (9 * h + 30_000, 0, 2), (9 * h + 60_000, 0, 2), (9 * h + 90_000, 0, 2),
                   (20 * h + 53 * 60_000, 1, 1)]


def test_a_stream_may_cross_midnight_and_a_day_key_restricts_it() -> None:
    """`to` before `from` runs past midnight; `day: 2` keeps a line to the second day."""
    text = GOOD.replace("days: 1", "days: 2").replace(
        '{from: "09:00", to: "09:02", every_seconds: 30, concurrency: 2,',
        '{from: "23:59", to: "00:01", every_seconds: 60, day: 2,')
    s = parse_scenario(text)
    times = [a.at_ms - s.start_ms for a in arrivals(s) if a.line == 0]
    day2 = MS_PER_DAY + 23 * 3_600_000 + 59 * 60_000
    assert times == [day2]  # 23:59 on day 2; 00:00 on day 3 is after the run's end


def test_every_shipped_scenario_loads_by_name_and_says_what_it_is() -> None:
    """Each shipped scenario parses, is named like its file, and opens with a description."""
    names = builtin_names()
    assert len(names) >= 10
    for name in names:
        assert load_scenario(name).name == name
        assert len(description(name)) > 40


def test_an_unknown_name_lists_the_shipped_scenarios() -> None:
    """A name that is neither a file nor shipped says which names exist."""
    with pytest.raises(ScenarioError, match="seed-0813-lag"):
        load_scenario("no-such-scenario")


def test_prior_usage_and_wipe_at_are_additions_checked_like_the_rest() -> None:
    """`prior_usage` and `wipe_at` parse (a file without them is unchanged), a wipe outside the
    run and an unknown key under `prior_usage` are errors naming their line."""
    assert (parse_scenario(GOOD).prior_usage, parse_scenario(GOOD).wipe_at) == (None, None)
    s = parse_scenario(GOOD + 'prior_usage: {tokens: 150000, minutes: 3}\nwipe_at: "14:05"\n')
    assert s.prior_usage is not None and (s.prior_usage.tokens, s.prior_usage.minutes) == (150_000, 3)
    assert s.wipe_ms == s.start_ms + (14 * 60 + 5) * 60_000
    late = _error(GOOD.replace("2026-08-13T00:00:00", "2026-08-13T15:00:00") + 'wipe_at: "14:05"\n')
    assert "s.yaml:11: wipe_at: the wipe is not inside the run" in late
    assert "s.yaml:11: prior_usage.minuets: unknown key" in _error(
        GOOD + "prior_usage: {tokens: 1, minuets: 3}\n")


def test_crash_at_is_an_addition_checked_like_the_rest() -> None:
    """`crash_at` parses (absent: no crash) and must fall inside the run, like `wipe_at`."""
    assert parse_scenario(GOOD).crash_ms is None
    s = parse_scenario(GOOD + 'crash_at: "23:40"\n')
    assert s.crash_ms == s.start_ms + (23 * 60 + 40) * 60_000
    late = _error(GOOD.replace("2026-08-13T00:00:00", "2026-08-13T15:00:00") + 'crash_at: "14:05"\n')
    assert "s.yaml:11: crash_at: the crash is not inside the run" in late


def test_lag_changes_are_an_addition_checked_like_the_rest() -> None:
    """`lag_changes` parse in time order whatever their order in the file; a change outside the
    run is an error naming its line."""
    assert parse_scenario(GOOD).lag_changes == []
    s = parse_scenario(GOOD + 'lag_changes:\n  - {at: "16:00", minutes: 20}\n'
                       '  - {at: "10:00", minutes: 240}\n')
    assert s.lag_schedule() == [(s.start_ms + 600 * 60_000, 240), (s.start_ms + 960 * 60_000, 20)]
    late = _error(GOOD.replace("2026-08-13T00:00:00", "2026-08-13T15:00:00")
                  + 'lag_changes:\n  - {at: "10:00", minutes: 240}\n')
    assert "s.yaml:12: lag_changes[0].at: this lag change is not inside the run" in late


def test_thinking_lines_follow_arks_caps() -> None:
    """n, reasoning and thinking parse with defaults (1, 0, on); max_tokens leaves reasoning
    uncapped, a total cap (max_completion_tokens) bounds reasoning + answer, per choice."""
    s = parse_scenario(GOOD.replace("completion: 50}", "completion: 50, n: 3, reasoning: 400}")
                       + "model_reasoning_tokens: 2048\n")
    line, plain = s.traffic
    assert (plain.n, plain.reasoning, plain.thinking, s.model_reasoning_tokens) == (1, 0, True, 2048)
    assert line.made(30, caps_total=False) == 3 * (400 + 30)
    assert line.made(300, caps_total=True) == 3 * 300
    assert line.made(None, caps_total=True) == 3 * 450
    off = parse_scenario(GOOD.replace("completion: 50}", "completion: 50, reasoning: 400, thinking: false}"))
    assert off.traffic[0].made(None, caps_total=False) == 50
    assert "n" in _error(GOOD.replace("completion: 50}", "completion: 50, n: 17}"))
