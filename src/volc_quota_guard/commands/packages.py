"""`volc-quota-guard packages`: list each account's resource packages and the pool each
one counts toward (or why it counts toward none)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from ..clock import to_beijing
from ..errors import ConfigError
from ..proxy.deployments import pools_from_litellm_config
from ..volcengine.billing import BillingClient, ResourcePackage
from ..volcengine.packages import Assignment, PoolSpec, assign


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "packages",
        help="list Volcengine resource packages and the pool each one counts toward",
        description="Calls ListResourcePackages for every account involved and shows how "
                    "packages map to pools (account/model).",
    )
    p.add_argument("--pool", action="append", default=[], metavar="ACCOUNT/MODEL",
                   help="a pool to match against (repeatable)")
    p.add_argument("--config", metavar="LITELLM_YAML",
                   help="take pools from a LiteLLM config's volcengine/ deployments")
    p.add_argument("--account", action="append", default=[],
                   help="also list this account (repeatable; default: 'default' when no pool)")
    p.add_argument("--endpoint", help="billing endpoint (default: VQG_BILLING_ENDPOINT or the "
                                      "SDK's own)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _pools(args: argparse.Namespace) -> list[PoolSpec]:
    specs: dict[str, PoolSpec] = {}
    if args.config:
        specs.update({s.pool: s for s in pools_from_litellm_config(args.config)})
    for pool in args.pool:
        try:
            specs.setdefault(pool, PoolSpec(pool))
        except ValueError as exc:
            raise ConfigError(f"--pool {pool}: {exc}") from None
    return list(specs.values())


def _package_json(pkg: ResourcePackage, pool: str | None, reason: str | None) -> dict[str, Any]:
    return {
        "instance_no": pkg.instance_no, "product": pkg.product,
        "configuration_code": pkg.configuration_code,
        "configuration_name": pkg.configuration_name, "unit": pkg.unit,
        "status": pkg.status, "total": pkg.total, "available": pkg.available,
        "effective_ms": pkg.effective_ms, "expires_ms": pkg.expires_ms,
        "pool": pool, "reason": reason,
    }


def _rows(assignment: Assignment) -> list[tuple[ResourcePackage, str | None, str | None]]:
    rows: list[tuple[ResourcePackage, str | None, str | None]] = []
    for a in assignment.pools.values():
        rows += [(p, a.pool, None) for p in a.packages]
    rows += [(u.package, None, u.reason) for u in assignment.unmatched]
    return rows


def _when(ms: int | None) -> str:
    return "" if ms is None else to_beijing(ms).strftime("%Y-%m-%d %H:%M")


def _print(console: Console, account: str, assignment: Assignment) -> None:
    table = Table(title=f"account {account}", title_justify="left")
    for col in ("InstanceNo", "ConfigurationCode", "Unit", "Status"):
        table.add_column(col)
    table.add_column("Available", justify="right")
    table.add_column("Total", justify="right")
    table.add_column("Expires (Beijing)")
    table.add_column("Pool / why not")
    for pkg, pool, reason in _rows(assignment):
        table.add_row(pkg.instance_no, pkg.configuration_code, pkg.unit, pkg.status,
                      f"{pkg.available:,}", f"{pkg.total:,}", _when(pkg.expires_ms),
                      f"[green]{pool}[/]" if pool else f"[dim]— {reason}[/]")
    console.print(table)
    summary = Table(title=f"pools of {account}", title_justify="left")
    summary.add_column("Pool")
    summary.add_column("Packages", justify="right")
    summary.add_column("Effective", justify="right")
    summary.add_column("Balance", justify="right")
    for a in assignment.pools.values():
        summary.add_row(a.pool, str(len(a.packages)), str(len(a.effective)), f"{a.balance:,}")
    if assignment.pools:
        console.print(summary)
    for a in assignment.pools.values():
        if not a.effective:
            console.print(f"[yellow]warning:[/] pool {a.pool} has no Effective package: "
                          f"it gets no headroom (check the name, or set vqg_packages)")


def run(args: argparse.Namespace) -> int:
    pools = _pools(args)
    accounts = sorted({p.account for p in pools} | set(args.account)) or ["default"]
    result: dict[str, Any] = {}
    console = Console(width=None if sys.stdout.isatty() else 200)
    for account in accounts:
        kwargs = {"endpoint": args.endpoint} if args.endpoint else {}
        client = BillingClient.for_account(account, **kwargs)
        packages = client.list_resource_packages()
        assignment = assign(packages, [p for p in pools if p.account == account])
        if args.json:
            result[account] = {
                "pools": {a.pool: {"balance": a.balance,
                                   "packages": [p.instance_no for p in a.packages]}
                          for a in assignment.pools.values()},
                "packages": [_package_json(p, pool, reason)
                             for p, pool, reason in _rows(assignment)],
            }
        else:
            _print(console, account, assignment)
    if args.json:
        print(json.dumps({"accounts": result}, ensure_ascii=False, indent=2))
    return 0
