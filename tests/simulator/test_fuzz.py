"""The scenario fuzzer: what it generates, and the guard's verdict on a seeded run (CI's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend import TEST_REDIS_URL
from volc_quota_guard.config import Settings
from volc_quota_guard.simulator import parse_scenario
from volc_quota_guard.simulator.engine import guard_settings
from volc_quota_guard.simulator.fuzz import (
    FAULTS,
    KNOWING,
    faults,
    knowing,
    run_fuzz,
    run_seed,
    scenario_dict,
    scenario_yaml,
)
from volc_quota_guard.simulator.scenario import arrivals

# CI (real Redis) runs 120 seeds, about 130 s of the suite's 2 cores (CI's whole run must stay under
# 15 minutes); the embedded store is ~2.4x slower, so a Redis-less run takes 50. Wider runs:
# scripts/fuzz_scenarios.py (README, docs/simulator.md).
CI_SEEDS = range(int(os.environ.get("VQG_FUZZ_SEEDS", "120" if TEST_REDIS_URL else "50")))


def test_the_fuzzer_covers_the_families_it_promises() -> None:
    """500 seeds parse as SCENARIOS.md v1 and span lag, tokenizer error, concurrency, durations,
    max_tokens or not, missing usage, expiring and arriving packages, Beijing midnight, starts
    on a busy account (prior usage), wiped stores, waves of a class counted far low, and pools
    that count exactly (their waves down to the exact class's ceiling), and Doubao pools (ark-api:
    the cheap count, a wave's as low, and the tokenization API's drift), and balance APIs hours
    behind (all run long, or an incident on day 1 that ends; half of those with a line nobody
    reports usage for), and first starts after more unseen usage than SMALL_BUFFER under a lag
    longer than the floor, and wipes seconds after a burst the last poll did not see, and calls
    the proxy gives up on before midnight while Ark runs them on, and lag incidents of hours
    beginning minutes after a busy stretch stops, and long calls running when a package expires,
    and first starts after unseen usage under a lag of 8-24 hours with 8 quiet hours first, and
    calls across an expiry that Ark runs on past the longest call the proxy keeps."""
    lags, ratios, conc, durations = set(), [], set(), []
    seen = {"max_tokens": 0, "no_max_tokens": 0, "missing": 0, "two_days": 0, "late_start": 0,
            "arriving": 0, "expiring": 0, "prior_usage": 0, "wipe": 0, "reasoning": 0, "thinking_off": 0,
            "n": 0, "allowance": 0, "unmeasured_wave": 0, "exact": 0, "exact_wave": 0,
            "missing_wave": 0, "ark_api": 0, "ark_api_wave": 0, "long_lag": 0, "lag_incident": 0,
            "busy_first_start": 0, "unreported_under_lag": 0, "burst_before_wipe": 0, "crash": 0,
            "given_up": 0, "incident_after_stop": 0, "calls_past_expiry": 0, "quiet_first_start": 0,
            "ark_runs_past_the_longest_call": 0}
    for seed in range(500):
        s = parse_scenario(scenario_yaml(seed), f"fuzz-{seed}")
        assert s == parse_scenario(scenario_yaml(seed)), "a seed must give the same scenario"
        lags.add(s.settlement_lag_minutes)
        seen["long_lag"] += s.settlement_lag_minutes > 45
        seen["lag_incident"] += any(c.minutes >= 60 for c in s.lag_changes)
        seen["ark_runs_past_the_longest_call"] += any(
            line.prompt == 1_000 and line.duration_seconds > 6_900 and line.gives_up_after_seconds
            for line in s.traffic) and any(
            p.expires is not None and s.start_ms < p.expires.timestamp() * 1000 < s.end_ms
            for p in s.packages)
        seen["calls_past_expiry"] += any(
            line.prompt == 1_000 and line.duration_seconds >= 2_700 for line in s.traffic) and any(
            p.expires is not None and s.start_ms < p.expires.timestamp() * 1000 < s.end_ms
            for p in s.packages)
        seen["incident_after_stop"] += any(
            c.minutes >= 120 and line.to is not None and 0 <= c.at - line.to <= 15 * 60_000
            for c in s.lag_changes for line in s.traffic)
        seen["unreported_under_lag"] += (s.settlement_lag_minutes > 45 or bool(s.lag_changes)) \
            and any(line.usage == "missing" for line in s.traffic)
        seen["two_days"] += s.days == 2
        seen["late_start"] += s.calendar_days > s.days
        seen["prior_usage"] += s.prior_usage is not None
        seen["busy_first_start"] += s.prior_usage is not None and s.prior_usage.tokens > 60_000 \
            and s.settlement_lag_minutes > 20
        seen["quiet_first_start"] += s.prior_usage is not None and s.settlement_lag_minutes >= 480 \
            and min(a.at_ms for a in arrivals(s)) - s.start_ms >= 8 * 3_600_000
        seen["wipe"] += s.wipe_at is not None
        seen["crash"] += s.crash_at is not None
        seen["burst_before_wipe"] += s.wipe_at is not None and s.wipe_at % 60_000 > 0 and any(
            line.single and line.concurrency >= 8 and line.at == s.wipe_at // 60_000 * 60_000 + 1_000
            for line in s.traffic)
        seen["allowance"] += s.model_reasoning_tokens > 0
        for p in s.packages:
            expires = (p.expires or p.acquired).timestamp() * 1000 + (0 if p.expires else 30 * 86_400_000)
            seen["arriving"] += p.acquired.timestamp() * 1000 > s.start_ms
            seen["expiring"] += s.start_ms < expires < s.end_ms
        for line in s.traffic:
            ratios.append(line.estimate_ratio)
            conc.add(line.concurrency)
            if line.gives_up_after_seconds is None:  # the twelfth generator's: 5-45 min
                durations.append(line.duration_seconds)
            seen["max_tokens" if line.max_tokens else "no_max_tokens"] += 1
            seen["missing"] += line.usage == "missing"
            seen["given_up"] += line.gives_up_after_seconds is not None \
                and line.gives_up_after_seconds < line.duration_seconds
            seen["reasoning"] += line.reasoning > 0
            seen["thinking_off"] += not line.thinking
            seen["n"] += line.n > 1
            seen["unmeasured_wave"] += line.estimate_ratio < 0.6 and line.concurrency >= 8
            seen["missing_wave"] += line.estimate_ratio < 0.6 and line.usage == "missing"
            seen["exact"] += line.counting == "exact"
            seen["exact_wave"] += line.counting == "exact" and line.estimate_ratio <= 0.75 \
                and line.concurrency >= 8
            seen["ark_api"] += line.counting == "ark-api"
            seen["ark_api_wave"] += line.counting == "ark-api" and line.estimate_ratio < 0.6
            if line.counting == "exact":
                assert 1 / 1.5 <= line.estimate_ratio <= 1.05  # within the exact class's ceiling
            if line.counting == "ark-api":
                assert 1 / 1.5 <= line.exact_ratio <= 1.05
        assert len({line.counting for line in s.traffic}) == 1  # one deployment: one method
    assert min(lags) == 0 and 45 in lags and max(lags) > 400
    assert min(ratios) < 0.36 and max(ratios) > 1.38
    assert {1, 32} <= conc
    # Up to 5 minutes, and the eleventh generator's requests that outlive the 900 s reservation
    # TTL (15-60 min), most of them across a Beijing midnight.
    assert min(durations) >= 1 and max(d for d in durations if d <= 300) == 300
    # (and the fourteenth's calls running when a package expires: up to 100 min)
    assert 900 <= min(d for d in durations if d > 300) and max(durations) <= 6000
    assert sum(d >= 900 for d in durations) > 20
    assert all(n > 5 for n in seen.values()), seen


def test_knowing_gives_the_guard_what_it_learns_only_after_the_fact() -> None:
    """`--knowing` rewrites a seed's scenario (the waste table in the README is measured so):
    every line reports usage, caps its output at what it makes, is counted exactly; the API is
    current; no SMALL_BUFFER. The seed's own scenario is left as it was."""
    seed = next(i for i in range(500) if any(line.get("usage") == "missing" and line.get("reasoning")
                                               for line in scenario_dict(i)["traffic"])  # type: ignore[attr-defined]
                and scenario_dict(i).get("lag_changes"))
    before = scenario_yaml(seed)
    s = parse_scenario(scenario_yaml(seed, KNOWING), "knowing")
    assert scenario_yaml(seed) == before
    assert s.settlement_lag_minutes == 0 and not s.lag_changes and s.small_buffer == 0
    assert s.model_reasoning_tokens == 0
    prior = scenario_dict(seed).get("prior_usage")
    assert s.unseen_day_tokens == (prior["tokens"] if isinstance(prior, dict) else 0)
    assert guard_settings(s).unseen_day_tokens == s.unseen_day_tokens
    assert guard_settings(parse_scenario(before)).unseen_day_tokens == Settings().unseen_day_tokens
    for line in s.traffic:
        assert line.usage is None and line.reasoning == 0 and line.max_tokens == max(1, line.completion)
        assert line.counting == "exact" and line.estimate_ratio == 1.0
    with pytest.raises(ValueError, match="unknown --knowing \\['guess'\\]"):
        knowing(scenario_dict(seed), ["usage", "guess"])
    # Through its entry point: the same seed, with and without the guard knowing usage.
    plain, known = run_seed(seed, TEST_REDIS_URL), run_seed(seed, TEST_REDIS_URL, know=["usage"])
    assert not plain.failed and not known.failed
    assert (known.served_tokens, known.refused_while_free) != (plain.served_tokens, plain.refused_while_free)
    # Seed 1: a 462,865 pool, nothing ran before the first start; told so, the guard keeps no
    # unseen bound off its walls (after a hold of Δ_assumed) and serves more, still billing 0.
    assert "prior_usage" not in scenario_dict(1)
    plain, known = run_seed(1, TEST_REDIS_URL), run_seed(1, TEST_REDIS_URL, know=["unseen"])
    assert not plain.failed and not known.failed
    assert known.served_tokens > plain.served_tokens
    script = Path(__file__).parents[2] / "scripts" / "fuzz_scenarios.py"
    bad = subprocess.run([sys.executable, str(script), "--knowing", "guess"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "choose from ['buffer', 'counts', 'lag', 'outputs', 'unseen', 'usage']" in bad.stderr


def test_each_seed_says_which_fault_families_it_draws() -> None:
    """`faults` names what a scenario draws beyond steady traffic on an always-watched account
    (the fuzz script splits its waste figures by it); knowing usage and the lag removes those."""
    drawn = {seed: faults(parse_scenario(scenario_yaml(seed))) for seed in range(300)}
    assert set().union(*drawn.values()) == set(FAULTS)
    assert any(not f for f in drawn.values())  # some seeds draw none
    for seed, found in drawn.items():
        d = scenario_dict(seed)
        lines = d["traffic"]
        assert ("wipe" in found) == ("wipe_at" in d) and ("crash" in found) == ("crash_at" in d)
        assert ("unreported" in found) == any(line.get("usage") == "missing" for line in lines)  # type: ignore[attr-defined]
        assert ("long lag" in found) == (d["settlement_lag_minutes"] > 20 or bool(d.get("lag_changes")))  # type: ignore[operator]
    seed = next(s for s, f in drawn.items() if {"unreported", "long lag"} <= set(f))
    known = faults(parse_scenario(scenario_yaml(seed, ["usage", "lag"])))
    assert "unreported" not in known and "long lag" not in known
    case = run_seed(seed, TEST_REDIS_URL)
    assert case.faults == drawn[seed]


def test_a_seed_that_cannot_run_is_a_failure_with_its_reason() -> None:
    """run_seed reports a crash as a failed case (with the seed) instead of raising."""
    case = run_seed(3, store_url="redis://127.0.0.1:1/0")  # nothing listens on port 1
    assert case.seed == 3 and case.failed
    assert case.error is not None and "Connection refused" in case.error


def test_the_guard_bills_nothing_and_burns_nothing_on_random_scenarios() -> None:
    """CI's seeded fuzz run: every scenario bills 0 and burns 0, and the guard still serves."""
    cases = run_fuzz(CI_SEEDS, store_url=TEST_REDIS_URL)
    failed = [c for c in cases if c.failed]
    assert not failed, "\n".join(
        f"seed {c.seed}: billed {c.billed} burned {c.burned} {c.error or ''} "
        f"(python scripts/fuzz_scenarios.py --seeds {c.seed})" for c in failed)
    served = sum(c.served_tokens for c in cases)
    refused = sum(c.refused_while_free for c in cases)
    assert served > 0 and refused < served  # a guard that refuses everything bills nothing either
