"""`volc-quota-guard` — the operator command line.

Each subcommand lives in `volc_quota_guard.commands.<name>` and exposes
`register(subparsers) -> None`, which adds its parser and sets `func=run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import commands
from .errors import QuotaGuardError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="volc-quota-guard",
        description="Keep Volcengine Ark free token quota from tipping into paid billing.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except QuotaGuardError as exc:
        print(f"volc-quota-guard: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
