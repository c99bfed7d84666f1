"""A YAML description of a fake Volcengine (for the CLI and the demo). Unknown keys are errors.

    start: "2026-08-13T08:00:00+08:00"   # fake clock start; default: now
    scale: 60                            # fake seconds per real second
    daily_cap: 2000000
    return_at: "10:30"                   # null: no return packages
    settlement_lag_minutes: 14
    noise: true                          # list the usual non-matching packages too
    chat: {completion_tokens: 64, reasoning_tokens: 0, media_tokens: 200000, count_cached: true}
    accounts:
      default: {access_key: AK…, secret_key: SK…, api_keys: [ark-default]}
    pools:
      default/doubao-seed-2-1-pro-260628:
        yesterday_collection: 1500000    # arrives at return_at today
        packages:
          - {amount: 2000000, available: 1200000, acquired: "-3d"}
          - {amount: 400000, acquired: "2026-07-15T09:00:00+08:00", expires: "+6h"}

Times are ISO 8601 with an offset, or an offset from ``start`` like ``-3d``, ``+6h``, ``-30m``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..clock import MS_PER_DAY, beijing_day
from ..errors import ConfigError
from .clock import ScaledClock
from .ledger import Ledger
from .server import DEFAULT_ACCOUNTS, FakeVolcengine
from .state import AccountSpec, ChatDefaults, FakeAccount

_RELATIVE_RE = re.compile(r"^([+-]\d+(?:\.\d+)?)([dhm])$")
_UNIT_MS = {"d": MS_PER_DAY, "h": 3_600_000, "m": 60_000}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AccountConfig(_Strict):
    access_key: str
    secret_key: str
    api_keys: list[str] = Field(default_factory=list)


class PackageConfig(_Strict):
    amount: int = Field(ge=0)
    available: int | None = Field(default=None, ge=0)
    acquired: str = "+0m"
    expires: str | None = None
    configuration_code: str | None = None
    configuration_name: str | None = None


class PoolConfig(_Strict):
    configuration_code: str | None = None
    yesterday_collection: int = Field(default=0, ge=0)
    packages: list[PackageConfig] = Field(default_factory=list)


class FakeConfig(_Strict):
    start: str | None = None
    scale: float = Field(default=1.0, gt=0)
    daily_cap: int = Field(default=2_000_000, ge=0)
    return_at: str | None = "10:30"
    settlement_lag_minutes: float = Field(default=14, ge=0)
    expiry_days: int = Field(default=30, ge=1)
    noise: bool = True
    chat: dict[str, Any] = Field(default_factory=dict)
    accounts: dict[str, AccountConfig] = Field(default_factory=dict)
    pools: dict[str, PoolConfig] = Field(default_factory=dict)


def to_ms(text: str, start_ms: int) -> int:
    """ISO 8601 with an offset, or ``±N[dhm]`` from ``start_ms``."""
    m = _RELATIVE_RE.match(text.strip())
    if m:
        return start_ms + int(float(m.group(1)) * _UNIT_MS[m.group(2)])
    dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if dt.tzinfo is None:
        raise ValueError(f"time {text!r} needs an offset (e.g. +08:00)")
    return int(dt.timestamp() * 1000)


def load_fake_config(path: str | Path) -> FakeConfig:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        return FakeConfig.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ConfigError(f"fake Volcengine config {path}: {exc}") from None


def build_fake(config: FakeConfig | None = None, *, host: str = "127.0.0.1", port: int = 0,
               scale: float | None = None) -> FakeVolcengine:
    """A FakeVolcengine (not started) as the config describes."""
    config = config or FakeConfig()
    try:
        start = int(time.time() * 1000) if config.start is None else to_ms(config.start, 0)
        clock = ScaledClock(start, scale or config.scale)
        accounts: Mapping[str, AccountSpec] = {
            name: FakeAccount(name, a.access_key, a.secret_key,
                              tuple(a.api_keys) or (f"ark-{name}",))
            for name, a in config.accounts.items()
        } or DEFAULT_ACCOUNTS
        ledger = Ledger(daily_cap=config.daily_cap, return_at=config.return_at,
                        lag_minutes=config.settlement_lag_minutes,
                        expiry_days=config.expiry_days)
        for pool, spec in config.pools.items():
            ledger.ensure_pool(pool, configuration_code=spec.configuration_code)
            if spec.yesterday_collection:
                ledger.set_collection(pool, beijing_day(start) - 1, spec.yesterday_collection)
            for p in spec.packages:
                ledger.add_package(
                    pool, p.amount, to_ms(p.acquired, start),
                    expires_ms=None if p.expires is None else to_ms(p.expires, start),
                    available=p.available, configuration_code=p.configuration_code,
                    configuration_name=p.configuration_name)
        return FakeVolcengine(accounts, ledger=ledger, clock=clock, host=host, port=port,
                              noise=config.noise, chat_defaults=ChatDefaults(**config.chat))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"fake Volcengine config: {exc}") from None
