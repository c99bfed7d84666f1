"""`volc-quota-guard demo` — a compressed Volcengine day through a real proxy; exits 1 if billed."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a compressed day of traffic through a real LiteLLM proxy "
                                    "with the guard, against a fake Volcengine (no credentials needed)")
    p.add_argument("--seconds", type=float, default=100.0,
                   help="real seconds of traffic (default 100 ≈ 08:00-14:40 Volcengine time)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import demo  # late: pulls in openai and the fake

    return demo.run(seconds=args.seconds)
