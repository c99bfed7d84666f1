"""Settings, read from the environment (prefix `VQG_`), validated once at startup.

A bad value stops startup with a `ConfigError` that names the variable and its allowed
range: a quota guard that silently falls back to a default is a guard nobody configured.
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from typing import Literal

from pydantic import AliasChoices, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import ConfigError

MIN_OUTPUT_TOKENS = 256  # a clamped answer shorter than this is useless: block instead
UPSTREAM_TIMEOUT_S = 6000.0  # LiteLLM's default request timeout (`litellm.request_timeout`)
# Ark documents no bound on how long it runs a call; this is the premise (docs/operating.md).
SLOWEST_DECODE_TPS = 4.0
RESERVATION_TTL_S = 900
KEEP_TTL_FACTOR = 4  # a reservation is kept (and renewed) at least this many TTLs


def reservation_keep_s(ttl_s: float, timeout_s: float = UPSTREAM_TIMEOUT_S) -> float:
    """How long the proxy keeps a reservation and renews its deadline (a TTL ahead, every third
    of one) while its request may still run: the call's upstream timeout plus a TTL."""
    return max(KEEP_TTL_FACTOR * ttl_s, timeout_s + ttl_s)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VQG_", extra="ignore", frozen=True)

    redis_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("VQG_REDIS_URL", "REDIS_URL"),
        description="Shared store; unset = the embedded store (one process only).",
    )
    redis_cluster: bool = Field(
        default=False,
        description="VQG_REDIS_URL names a node of a Redis Cluster: use a cluster client.",
    )
    key_prefix: str = Field(default="vqg", pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    small_buffer: int = Field(
        default=50_000,
        ge=0,
        le=10_000_000,
        validation_alias=AliasChoices("VQG_SMALL_BUFFER", "SMALL_BUFFER"),
        description="Tokens kept back below the free balance (balance wall).",
    )
    daily_cap: int = Field(default=2_000_000, ge=1, le=1_000_000_000,
                           description="Collection cap per pool per Beijing day.")
    lag_floor_minutes: int = Field(default=20, ge=1, le=1440,
                                   description="Lowest settlement lag the limit assumes.")
    cold_start_admit_tokens: int = Field(
        default=0, ge=0, le=1_000_000_000,
        description="Tokens a pool may use while its history is shorter than the lag (first start, "
                    "lost state) when no unseen bound applies (VQG_UNSEEN_DAY_TOKENS=0 and no "
                    "state lost under a running process); 0 = none until the hold ends.")
    unseen_day_tokens: int = Field(
        default=200_000, ge=0, le=1_000_000_000,
        description="Usage the guard assumes ran unseen before a pool's history began (a first start, "
                    "lost state): the daily cap is lowered by this until Beijing midnight (when the "
                    "history begins after it), and the balance wall by this less what truly ran "
                    "unseen for the life of the history; 0 = the account was idle.")
    reservation_ttl_seconds: int = Field(
        default=RESERVATION_TTL_S, ge=10, le=86_400,
        description="After this, an unsettled reservation counts as consumed.")
    max_call_seconds: float = Field(
        default=UPSTREAM_TIMEOUT_S, ge=1, le=86_400,
        description="The longest a guarded call may run: the hook caps its timeout here and cuts "
                    "a stream still running then, and a package expiring before a snapshot's "
                    "validity plus this is kept off the wall.")
    slowest_decode_tokens_per_second: float = Field(
        default=SLOWEST_DECODE_TPS, gt=0, le=100_000,
        description="The slowest rate the guard assumes Ark writes a call's output at, once the call "
                    "has had VQG_MAX_CALL_SECONDS: Ark may run a call on after the proxy gave up on "
                    "it, so a package expiring before the call's output cap could be written at "
                    "this rate is kept off that call's wall.")
    snapshot_max_age_minutes: int = Field(default=90, ge=5, le=1440,
                                          description="Older snapshots give no headroom.")
    evict_below: int = Field(default=1_000, ge=0, le=10_000_000,
                             description="Headroom under which a pool leaves routing.")
    fail_mode: Literal["closed", "open"] = "closed"
    max_clock_skew_seconds: float = Field(
        default=2.0, ge=0.1, le=300.0,
        description="Redis's clock (the Beijing day, expiries) may differ from this host's by this "
                    "much; beyond it guarded requests are refused with a 503 until they agree.")
    default_output_tokens: int = Field(
        default=4_096, ge=1, le=10_000_000,
        description="The answer cap pinned when the request sets none (Ark's own max_tokens default); "
                    "a deployment's max_output_tokens lowers it.")
    estimate_correction_min: float = Field(
        default=1.7, ge=1.0, le=100.0,
        description="Least factor on the tokenizer's prompt count (and its value before any measurement).")
    estimate_correction_max: float = Field(
        default=3.0, ge=1.0, le=100.0,
        description="The most the learned correction may multiply the tokenizer's prompt count by.")
    exact_count_min_tokens: int = Field(
        default=2_000, ge=0, le=10_000_000,
        description="An ark-api deployment asks Ark's tokenization API for prompts the cheap count "
                    "puts at this many tokens or more (and for any that does not fit).")

    sync_enabled: bool = Field(default=True, description="Run the billing sync thread in the proxy.")
    sync_poll_seconds: float = Field(default=5.0, ge=0.05, le=300,
                                     description="How often the sync thread checks whether a sync is due.")
    sync_interval_minutes: int = Field(default=30, ge=1, le=1440)
    sync_low_interval_minutes: int = Field(default=5, ge=1, le=1440)
    low_headroom_tokens: int = Field(default=300_000, ge=0, le=1_000_000_000)
    burst_tokens: int = Field(default=100_000, ge=1, le=1_000_000_000)
    billing_endpoint: str | None = None
    billing_region: str = "cn-beijing"

    consume_enabled: bool = Field(default=False,
                                  description="Run the nightly consume task in the proxy's sync thread.")
    consume_at: str = Field(default="23:00", pattern=r"^([01]\d|2[0-3]):[0-5]\d$",
                            description="Beijing time (HH:MM) from which the nightly consume task runs.")
    consume_call_tokens: int = Field(default=32_000, ge=1_000, le=1_000_000,
                                     description="Most tokens one consume call may use (prompt + output).")
    consume_output_tokens: int = Field(default=4_096, ge=16, le=1_000_000,
                                       description="Output cap (max_tokens) of one consume call.")
    consume_min_call_tokens: int = Field(default=2_000, ge=1_000, le=1_000_000,
                                         description="A plan remainder below this is not worth a call.")
    consume_max_errors: int = Field(default=3, ge=1, le=100,
                                    description="Consecutive failed consume calls that stop the run.")
    consume_timeout_seconds: float = Field(default=300, ge=1, le=3_600,
                                           description="Timeout of one consume call to Ark.")

    metrics_port: int = Field(default=0, ge=0, le=65_535,
                              description="Prometheus endpoint port in each proxy process; 0 = off.")
    metrics_host: str = Field(default="127.0.0.1", min_length=1,
                              description="Address the Prometheus endpoint binds to.")

    @model_validator(mode="after")
    def _correction_min_within_max(self) -> Settings:
        if self.estimate_correction_min > self.estimate_correction_max:
            raise ValueError(f"VQG_ESTIMATE_CORRECTION_MIN={self.estimate_correction_min} must not "
                             f"exceed VQG_ESTIMATE_CORRECTION_MAX={self.estimate_correction_max}")
        return self

    def longest_call_ms(self) -> int:
        """How long after its admission a call may still be running (and renewed): the longest
        call the hook lets run plus a TTL. The wall's expiry window reaches this far."""
        return int(1000 * reservation_keep_s(self.reservation_ttl_seconds, self.max_call_seconds))

    def call_run_ms(self, call_s: float, output: int) -> int:
        """How long after its admission Ark may still run a call the proxy lets run `call_s`:
        as long as the proxy keeps it, then its whole output, every choice's, at the slowest
        decode rate (choices written one after another: the longer reading; Ark is
        never told to stop a call the proxy gave up on; stop 44's red team billed 676,000 with
        calls that ran 190 minutes across an expiry)."""
        keep = reservation_keep_s(self.reservation_ttl_seconds, call_s)
        return int(1000 * (keep + output / self.slowest_decode_tokens_per_second))

    def correction_ppm(self) -> tuple[int, int]:
        """The estimate correction's start and bound as the gate takes them (parts per million)."""
        return (round(self.estimate_correction_min * 1_000_000),
                round(self.estimate_correction_max * 1_000_000))


# Field name -> (env var, allowed) for error messages.
def _describe(name: str) -> tuple[str, str]:
    field = Settings.model_fields[name]
    env = f"VQG_{name.upper()}"
    lo = hi = None
    for m in field.metadata:
        lo = getattr(m, "ge", lo)
        hi = getattr(m, "le", hi)
    if lo is not None and hi is not None:
        kind = "a number" if field.annotation is float else "an integer"
        return env, f"{kind} from {lo:,} to {hi:,}"
    if name == "fail_mode":
        return env, "'closed' or 'open'"
    if name == "key_prefix":
        return env, "1-64 characters of A-Z a-z 0-9 _ . : -"
    if name == "consume_at":
        return env, "a Beijing time HH:MM (00:00 to 23:59)"
    if field.annotation is bool:
        return env, "true or false"
    return env, "a valid value"


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment; raise ConfigError naming the bad variable."""
    if os.environ.get("VQG_COUNT_CACHED_TOKENS", "").strip().lower() in ("0", "false", "no", "off"):
        logging.getLogger("volc_quota_guard").warning(
            "⚠️ [CONFIG] VQG_COUNT_CACHED_TOKENS is no longer read: a cache hit draws on the free "
            "quota, so cached prompt tokens always count")
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            if not err["loc"]:  # a rule across fields: its message names them
                problems.append(str(err["msg"]).removeprefix("Value error, "))
                continue
            name = str(err["loc"][0])
            name = name.removeprefix("VQG_").lower()
            if name in Settings.model_fields:
                env, allowed = _describe(name)
            else:
                env, allowed = name, "a valid value"
            problems.append(f"{env}={err.get('input')!r} is invalid: must be {allowed}")
        raise ConfigError("; ".join(problems)) from None
    default_cap = Settings.model_fields["daily_cap"].default
    if settings.daily_cap > default_cap:
        logging.getLogger("volc_quota_guard").warning(
            "⚠️ [CONFIG] VQG_DAILY_CAP=%s is above the %s tokens per model per Beijing day that "
            "Volcengine's collection cap was last seen at: what is consumed past the real cap is "
            "never returned. Keep it only if your account's cap is that high.",
            f"{settings.daily_cap:,}", f"{default_cap:,}")
    return settings


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The process-wide settings, read on first use."""
    return load_settings()
