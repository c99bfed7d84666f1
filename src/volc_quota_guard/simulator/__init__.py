"""The simulator: scenarios (docs/simulator.md) run against the guard and the seed's formulas.

    scenario = load_scenario("seed-0813-lag")          # a shipped name or a YAML path
    result = simulate(scenario, "guard")               # RunResult; .as_json() is the output object
"""

from __future__ import annotations

from .engine import RESULT_KEYS, RunResult, Series, guard_settings, run_all, simulate
from .scenario import (
    Scenario,
    ScenarioError,
    builtin_names,
    description,
    load_scenario,
    parse_scenario,
)
from .strategies import POOL, STRATEGIES, SimulationError

__all__ = [
    "POOL",
    "RESULT_KEYS",
    "STRATEGIES",
    "RunResult",
    "Scenario",
    "ScenarioError",
    "Series",
    "SimulationError",
    "builtin_names",
    "description",
    "guard_settings",
    "load_scenario",
    "parse_scenario",
    "run_all",
    "simulate",
]
