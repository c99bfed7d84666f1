"""The benchmarks in scripts/bench/ still run: each at its smallest size prints its figure.

Not a timing test (the numbers are not read): a benchmark that stopped working (hook_bench.py
died at its first reserve once the guard refused an Ark key shared by two accounts, and nothing
noticed) leaves the README's tables unreproducible.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend import TEST_REDIS_URL

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench"

# script, its smallest arguments, a piece of the line that carries the figure
CASES = [
    ("hook_bench.py", ["--requests", "20", "--rounds", "1"], "µs CPU per request"),
    ("precall_bench.py", ["--reps", "1"], "| 1,000 /"),
    ("gate_bench.py", ["--pairs", "50", "--threads", "2"], "reserve+settle"),
    ("memory_bench.py", ["--per-day", "50", "--days", "2"], "| 2 |"),
]


@pytest.mark.parametrize(("script", "args", "figure"), CASES, ids=[c[0] for c in CASES])
def test_benchmark_runs(script: str, args: list[str], figure: str, store_url: str) -> None:
    if script == "memory_bench.py" and not TEST_REDIS_URL:
        pytest.skip("platform limit: MEMORY USAGE needs a real Redis server (CI has one)")
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    done = subprocess.run([sys.executable, str(BENCH / script), "--url", store_url, *args],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert figure in done.stdout, done.stdout[-3000:]
