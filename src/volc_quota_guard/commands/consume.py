"""`volc-quota-guard consume [--dry-run] [--pool P]` — run (or show) the nightly consume task now.

Reads the shared store (VQG_REDIS_URL, VQG_KEY_PREFIX). `--dry-run` prints each pool's plan
and its reasons and writes nothing. A real run needs the LiteLLM config (`--config`) to call
each pool's deployment with its own key; it takes the day's claim, so it does not run twice
on a day the proxy's scheduled task has run (nor the other way round).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..clock import to_beijing
from ..config import load_settings
from ..consume import ConsumeOutcome, ConsumeTask, outcome_json
from ..errors import ConfigError
from ..gate import Gate, KeySpace
from ..gate.store import connect
from ..proxy.deployments import read_model_list, targets_from_model_list
from ..volcengine.ark import ArkTarget
from . import pool_arg


def register(sub: Any) -> None:
    p = sub.add_parser("consume", help="use free tokens that would expire unused (the nightly task)",
                       description="Plans from the shared store (VQG_REDIS_URL, VQG_KEY_PREFIX); "
                                   "calls Ark with the deployments of --config.")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its reasons; write nothing")
    p.add_argument("--pool", action="append", default=[], type=pool_arg, metavar="ACCOUNT/MODEL",
                   help="only this pool (repeatable; default: every pool with a snapshot)")
    p.add_argument("--config", metavar="LITELLM_YAML",
                   help="the proxy's LiteLLM config: where each pool's api_base and api_key are")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _targets(path: str | None) -> dict[str, ArkTarget]:
    return {} if path is None else targets_from_model_list(read_model_list(path))


def _print(outcome: ConsumeOutcome, dry_run: bool) -> None:
    plan = outcome.plan
    head = f"{outcome.pool}:"
    if plan is None:
        print(f"{head} not planned: {outcome.stop}")
        return
    print(f"{head} plan={plan.tokens:,} need={plan.need:,} "
          f"(collection room {plan.collection_room:,}, balance room {plan.balance_room:,}, "
          f"after SMALL_BUFFER)")
    print(f"  reason: {plan.reason}")
    for f in plan.fates:
        when = f"{to_beijing(f.expires_ms):%Y-%m-%d %H:%M}"
        night = "tonight" if f.due_run == 0 else f"by night +{f.due_run}"
        print(f"  {f.instance_no}: {f.available:,} now, expires {when}, "
              f"~{f.waste:,} unused at expiry ({night})")
    if not dry_run:
        print(f"  {outcome.status}: consumed {outcome.consumed:,} in {outcome.calls} call(s); "
              f"{outcome.stop}")


def run(args: argparse.Namespace) -> int:
    cfg = load_settings()
    keyspace = KeySpace(cfg.key_prefix)
    gate = Gate(connect(cfg.redis_url), keyspace)
    if not args.dry_run and not args.config:
        raise ConfigError("a real run needs --config LITELLM_YAML (each pool's api_base and "
                          "api_key); use --dry-run to see the plan")
    targets = _targets(args.config)
    pools = args.pool or gate.pools()
    task = ConsumeTask(cfg, gate, lambda: targets)
    try:
        outcomes = [task.run_pool(pool, targets.get(pool), dry_run=args.dry_run) for pool in pools]
    finally:
        task.chat.close()
    if args.json:
        print(json.dumps({"dry_run": args.dry_run, "pools": [outcome_json(o) for o in outcomes]},
                         ensure_ascii=False, indent=2))
    else:
        if not outcomes:
            print(f"no pools with a snapshot under prefix {cfg.key_prefix!r}")
        for outcome in outcomes:
            _print(outcome, args.dry_run)
    return 0
