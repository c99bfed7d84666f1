"""`volc-quota-guard fake-volcengine`: run the fake Volcengine in the foreground (demo, docs)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from ..clock import to_beijing
from ..fake.config import FakeConfig, build_fake, load_fake_config


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fake-volcengine",
        help="run a local fake Volcengine (billing API + Ark chat + /_fake admin)",
        description="Serves ListResourcePackages, /api/v3/chat/completions and /_fake/ admin "
                    "endpoints from a simulated ledger until Ctrl-C.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--scale", type=float, default=None,
                   help="fake seconds per real second (60: a day in 24 minutes)")
    p.add_argument("--config", help="YAML: accounts, pools, packages, rules (see docs)")
    p.add_argument("--package", action="append", default=[], metavar="POOL=AMOUNT",
                   help="give POOL (account/model) a fresh package of AMOUNT tokens")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    config = load_fake_config(args.config) if args.config else FakeConfig()
    fake = build_fake(config, host=args.host, port=args.port, scale=args.scale)
    for item in args.package:
        pool, _, amount = item.rpartition("=")
        fake.add_package(pool, int(amount.replace("_", "")))
    now = fake.now_ms()
    address = f"http://{'127.0.0.1' if args.host in ('', '0.0.0.0') else args.host}:{args.port}"
    print(f"fake Volcengine on {address}  (clock {to_beijing(now):%Y-%m-%d %H:%M} Beijing, "
          f"x{fake.clock.scale if hasattr(fake.clock, 'scale') else 1:g})")
    print(f"  billing:  VQG_BILLING_ENDPOINT={address}")
    print(f"  ark:      api_base: {address}/api/v3")
    print(f"  admin:    {address}/_fake/state")
    for acct in fake.accounts.values():
        env = "" if acct.name == "default" else "_" + acct.name.upper().replace("-", "_")
        print(f"  account {acct.name}: VOLC_ACCESSKEY{env}={acct.access_key} "
              f"VOLC_SECRETKEY{env}=<from config>  api_key={', '.join(acct.api_keys)}")
    for pool in fake.ledger.pools():
        print(f"  pool {pool}: balance {fake.pool_totals(pool).true_balance:,}")
    try:
        fake.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0
