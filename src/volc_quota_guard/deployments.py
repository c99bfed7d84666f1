"""Which LiteLLM deployments are guarded, and which pool each one draws from.

A pool is (Volcengine account, upstream Ark model), read only from the operator's deployment
config: `litellm_params.model` and `model_info.vqg_account`. Nothing the client sends (alias,
metadata, headers) takes part, so no client can move a request to another pool or out of the
guard. Every `volcengine` deployment is guarded unless the operator sets `vqg_guard: false`;
`vqg_guard: true` opts in a deployment of another provider that points at Ark.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .keys import pool_id

PROVIDER = "volcengine"
DEFAULT_ACCOUNT = "default"


class GuardConfigError(ValueError):
    """A guarded deployment's config cannot name a valid pool (a fail-closed refusal)."""


@dataclass(frozen=True)
class GuardedDeployment:
    """A deployment the guard reserves for, with the pool it draws from."""

    model_id: str
    account: str
    upstream_model: str
    pool: str
    model_info: Mapping[str, Any] = field(default_factory=dict, compare=False)


def _flag(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def split_provider(model: str, provider: str | None) -> tuple[str, str | None]:
    """(upstream model, provider) from `litellm_params.model` and `custom_llm_provider`."""
    if provider:
        prefix = f"{provider}/"
        return (model[len(prefix):] if model.startswith(prefix) else model), provider
    head, sep, rest = model.partition("/")
    if sep and rest:
        return rest, head
    return model, None


def guard_for(model: object, provider: object,
              model_info: Mapping[str, Any] | None) -> GuardedDeployment | None:
    """The guard of one deployment, or None when it is not guarded.

    Raises GuardConfigError when the deployment is guarded but names no valid pool.
    """
    info = model_info or {}
    if not isinstance(model, str) or not model:
        return None
    upstream, prov = split_provider(model, provider if isinstance(provider, str) else None)
    opted = _flag(info.get("vqg_guard"))
    if opted is False or (opted is None and prov != PROVIDER):
        return None
    account = info.get("vqg_account") or DEFAULT_ACCOUNT
    model_id = str(info.get("id") or "")
    try:
        pool = pool_id(str(account), upstream)
    except ValueError as exc:
        raise GuardConfigError(f"deployment {model_id or model!r}: {exc}") from None
    return GuardedDeployment(model_id, str(account), upstream, pool, info)


def guard_for_deployment(deployment: Mapping[str, Any]) -> GuardedDeployment | None:
    """`guard_for` on a router deployment dict (`litellm_params` + `model_info`)."""
    params = deployment.get("litellm_params") or {}
    return guard_for(params.get("model"), params.get("custom_llm_provider"),
                     deployment.get("model_info") or {})


def guarded_deployments(model_list: Iterable[Mapping[str, Any]]
                        ) -> Iterator[tuple[Mapping[str, Any], GuardedDeployment]]:
    """Each deployment of a LiteLLM ``model_list`` the guard guards, with its guard; a
    misconfigured one stops the caller with a ``ConfigError`` naming it (an operator's command
    must not silently skip a pool)."""
    for deployment in model_list:
        try:
            guard = guard_for_deployment(deployment)
        except GuardConfigError as exc:
            raise ConfigError(str(exc)) from None
        if guard is not None:
            yield deployment, guard
