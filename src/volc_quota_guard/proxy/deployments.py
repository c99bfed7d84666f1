"""Which LiteLLM deployments are guarded, and which pool each one draws from.

A pool is (Volcengine account, upstream Ark model), read only from the operator's deployment
config: `litellm_params.model` and `model_info.vqg_account`. Nothing the client sends (alias,
metadata, headers) takes part, so no client can move a request to another pool or out of the
guard. Every `volcengine` deployment is guarded unless the operator sets `vqg_guard: false`;
`vqg_guard: true` opts in a deployment of another provider that points at Ark.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import SecretStr

from ..admission import REWRITTEN_AFTER_HOOK
from ..errors import ConfigError, GuardConfigError
from ..gate.keys import pool_id
from ..volcengine.accounts import DEFAULT_ACCOUNT, env_names
from ..volcengine.ark import ArkTarget
from ..volcengine.packages import PackageRule, PoolSpec

PROVIDER = "volcengine"
DEFAULT_API_BASE = "https://ark.cn-beijing.volces.com/api/v3"  # LiteLLM's volcengine default
_ENV_PREFIX = "os.environ/"


@dataclass(frozen=True)
class GuardedDeployment:
    """A deployment the guard reserves for, with the pool it draws from."""

    model_id: str
    account: str
    upstream_model: str
    pool: str
    model_info: Mapping[str, Any] = field(default_factory=dict, compare=False)


def flag(value: object) -> bool | None:
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
    opted = flag(info.get("vqg_guard"))
    if opted is False or (opted is None and prov != PROVIDER):
        return None
    account = info.get("vqg_account") or DEFAULT_ACCOUNT
    model_id = str(info.get("id") or "")
    try:
        pool = pool_id(str(account), upstream)
    except ValueError as exc:
        raise GuardConfigError(f"deployment {model_id or model!r}: {exc}") from None
    return GuardedDeployment(model_id, str(account), upstream, pool, info)


# Deployment parameters LiteLLM applies after the deployment hook sized the call: a prompt
# template (expanded in `acompletion`), retrieval, cache-control injection.
AFTER_HOOK_PARAMS = ("prompt_id", *REWRITTEN_AFTER_HOOK)
_ARK_HOSTS = (".volces.com", ".volcengineapi.com", ".byteplusapi.com")


def _host(base: str) -> str:
    return base.strip().lower().split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1].split(":", 1)[0]


def is_ark_base(api_base: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether an api_base sends to Ark: an Ark host, or the base LiteLLM's volcengine uses."""
    base = api_base.strip().rstrip("/").lower()
    if not base:
        return False
    if _host(base).endswith(_ARK_HOSTS):
        return True
    env = os.environ if env is None else env
    ark = env.get("VOLCENGINE_API_BASE", "").strip().rstrip("/").lower()
    return bool(ark) and base == ark


# LiteLLM's provider pass-through routes (`/openai/*`, `/mistral/*`, `/vllm/*` …) send a body as is
# to a base named by a provider variable (OPENAI_API_BASE, MISTRAL_API_BASE, VLLM_API_BASE …).
# None of them is Volcengine's: these prefixes name Ark itself, or this package.
_OWN_PREFIXES = ("VQG_", "VOLC", "ARK_")


def pass_through_to_ark(env: Mapping[str, str], settings: Mapping[str, Any] | None,
                        ark_bases: Iterable[str] = ()) -> str | None:
    """The first provider variable or `pass_through_endpoints` target that points a LiteLLM
    pass-through route at Ark (an Ark host, or the host of a guarded deployment's `ark_bases`),
    where such a call is neither reserved nor settled; else None."""
    hosts = {_host(b) for b in ark_bases if b}

    def to_ark(base: str) -> bool:
        return is_ark_base(base, env) or (bool(base.strip()) and _host(base) in hosts)

    for name in sorted(env):
        if name.endswith(("_API_BASE", "_BASE_URL")) and not name.startswith(_OWN_PREFIXES) \
                and to_ark(env[name]):
            return name
    routes = (settings or {}).get("pass_through_endpoints") or ()
    for i, route in enumerate(routes if isinstance(routes, list) else ()):
        target = route.get("target") if isinstance(route, Mapping) else None
        if isinstance(target, str) and to_ark(_resolve(target, env)):
            return f"general_settings.pass_through_endpoints[{i}].target"
    return None


def credential_values(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """The values of the LiteLLM credential a deployment or call names (`litellm_credential_name`):
    LiteLLM fills a missing `api_key` / `api_base` from them after the guard's hook."""
    name = params.get("litellm_credential_name")
    litellm = sys.modules.get("litellm")
    if not name or litellm is None:
        return {}
    for item in getattr(litellm, "credential_list", None) or ():
        if getattr(item, "credential_name", None) == name:
            values = getattr(item, "credential_values", None)
            return values if isinstance(values, Mapping) else {}
    return {}


def api_base_of(params: Mapping[str, Any], env: Mapping[str, str] | None = None) -> str:
    """Where a deployment or call sends: its `api_base` (or `base_url`), else its credential's."""
    env = os.environ if env is None else env
    own = params.get("api_base") or params.get("base_url")
    return _resolve(own or credential_values(params).get("api_base"), env)


def api_key_of(params: Mapping[str, Any], env: Mapping[str, str] | None = None) -> str:
    """The Ark key a deployment calls with: its `api_key`, its credential's, else the
    `VOLCENGINE_API_KEY` LiteLLM's volcengine provider reads."""
    env = os.environ if env is None else env
    own = params.get("api_key") or credential_values(params).get("api_key")
    return _resolve(own, env) or env.get("VOLCENGINE_API_KEY", "").strip()


def guard_for_deployment(deployment: Mapping[str, Any],
                         env: Mapping[str, str] | None = None) -> GuardedDeployment | None:
    """`guard_for` on a router deployment dict (`litellm_params` + `model_info`).

    Raises GuardConfigError when a guarded deployment sets a parameter LiteLLM applies after
    the guard's hook (`additional_drop_params` can strip the pinned output cap; a prompt
    template or retrieval rewrites the messages), and when a deployment the guard would pass
    looks meant for it — `vqg_*` keys, or an api_base on Ark — without an explicit `vqg_guard`.
    """
    params = deployment.get("litellm_params") or {}
    info = deployment.get("model_info") or {}
    guard = guard_for(params.get("model"), params.get("custom_llm_provider"), info)
    name = str(info.get("id") or params.get("model"))
    if guard is None:
        if flag(info.get("vqg_guard")) is None:
            _check_unguarded(name, params, info, env)
        return None
    for key in ("additional_drop_params", *AFTER_HOOK_PARAMS):
        if params.get(key):
            raise GuardConfigError(f"deployment {name!r}: litellm_params.{key} is applied by LiteLLM "
                                   "after the quota guard sized the call (it can remove the pinned "
                                   "output cap or rewrite the messages); remove it from guarded "
                                   "deployments")
    return guard


def _check_unguarded(name: str, params: Mapping[str, Any], info: Mapping[str, Any],
                     env: Mapping[str, str] | None) -> None:
    """A deployment the guard passes must not look like one it should guard."""
    provider = split_provider(str(params.get("model") or ""), params.get("custom_llm_provider"))[1]
    keys = sorted(k for k in info if isinstance(k, str) and k.startswith("vqg_"))
    if keys:
        raise GuardConfigError(f"deployment {name!r} sets model_info.{keys[0]} but its provider is "
                               f"{provider!r}, which the quota guard does not guard by default: set "
                               "model_info.vqg_guard: true to guard it (or false to pass it unguarded)")
    base = api_base_of(params, env)
    if base and is_ark_base(base, env):
        raise GuardConfigError(f"deployment {name!r} sends to Ark ({base}) through provider "
                               f"{provider!r}, which the quota guard does not guard by default: set "
                               "model_info.vqg_guard: true to guard it (or false to pass it unguarded)")


def conflicts(model_list: Iterable[Mapping[str, Any]],
              env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Guarded deployments whose pools would count one Volcengine account as two: deployment
    name -> why. Two account names that read the same credentials (the same variables, or the
    same access key copied into two), or one Ark API key under two accounts (a key belongs to
    one account), each hold one free quota counted twice."""
    env = os.environ if env is None else env
    seen: list[tuple[str, GuardedDeployment, str]] = []
    for deployment in model_list:
        try:
            guard = guard_for_deployment(deployment, env)
        except GuardConfigError:
            continue  # refused on its own
        if guard is None:
            continue
        key = api_key_of(deployment.get("litellm_params") or {}, env)
        seen.append((guard.model_id or guard.pool, guard, key))
    found: dict[str, str] = {}
    rules: list[tuple[Callable[[GuardedDeployment, str], str], str]] = [
        (lambda g, _: _credential_name(g.account), "read the same Volcengine credentials: one "
         "account's free quota would be counted as two; spell the account one way"),
        (lambda _, key: key, "share one Ark API key, and a key belongs to one Volcengine account: "
         "its free quota would be counted as two; give the deployments with that key one vqg_account"),
        (lambda g, _: _access_key(g.account, env), "are given the same Volcengine access key: one "
         "account's free quota would be counted as two; give the deployments one vqg_account"),
    ]
    for value_of, why in rules:
        accounts: dict[str, set[str]] = {}
        for _, guard, key in seen:
            accounts.setdefault(value_of(guard, key), set()).add(guard.account)
        for name, guard, key in seen:
            group = accounts.get(value_of(guard, key), set())
            if value_of(guard, key) and len(group) > 1:
                listed = " and ".join(repr(a) for a in sorted(group))
                found.setdefault(name, f"accounts {listed} {why}")
    return found


def _access_key(account: str, env: Mapping[str, str]) -> str:
    try:
        return env.get(env_names(account)[0], "").strip()
    except ConfigError:
        return ""


def _credential_name(account: str) -> str:
    try:
        return env_names(account)[0]
    except ConfigError:
        return account


def guarded_deployments(model_list: Iterable[Mapping[str, Any]]
                        ) -> Iterator[tuple[Mapping[str, Any], GuardedDeployment]]:
    """Each deployment of a LiteLLM ``model_list`` the guard guards, with its guard; a
    misconfigured one stops the caller with a ``ConfigError`` naming it (an operator's command
    must not silently skip a pool)."""
    model_list = list(model_list)
    clashes = conflicts(model_list)
    for deployment in model_list:
        try:
            guard = guard_for_deployment(deployment)
        except GuardConfigError as exc:
            raise ConfigError(str(exc)) from None
        if guard is not None:
            name = guard.model_id or guard.pool
            if name in clashes:
                raise ConfigError(f"deployment {name!r}: {clashes[name]}")
            yield deployment, guard


# -- what the model list holds: pools to sync, deployments to call ----------------------------


def pools_from_model_list(model_list: Iterable[Mapping[str, Any]]) -> list[PoolSpec]:
    """Pools of a LiteLLM ``model_list``: every deployment the guard guards (see
    ``guard_for_deployment``), with ``model_info.vqg_packages`` as its rule."""
    from ..counting import method_for  # imports litellm: only where a model list is read

    found: dict[str, PoolSpec] = {}
    for _, guard in guarded_deployments(model_list):
        pool, info = guard.pool, guard.model_info
        rule = PackageRule.parse(info["vqg_packages"]) if info.get("vqg_packages") else None
        method_for(guard.upstream_model, info)  # a bad vqg_tokenizer stops startup: ConfigError
        old = found.get(pool)
        if old is not None and old.rule is not None and rule is not None and old.rule != rule:
            raise ConfigError(f"deployments of pool {pool} disagree on vqg_packages")
        found[pool] = PoolSpec(pool, rule or (old.rule if old else None))
    return [found[p] for p in sorted(found)]


def read_model_list(path: str | Path) -> list[Any]:
    """The ``model_list`` of a LiteLLM proxy config file; a clear error when it is unreadable."""
    try:
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read LiteLLM config {path}: {exc}") from None
    if not isinstance(config, Mapping):
        raise ConfigError(f"LiteLLM config {path} is not a mapping")
    return list(config.get("model_list") or [])


def pools_from_litellm_config(path: str | Path) -> list[PoolSpec]:
    """Pools of a LiteLLM proxy config file (see ``pools_from_model_list``)."""
    return pools_from_model_list(read_model_list(path))


def _resolve(value: object, env: Mapping[str, str]) -> str:
    text = str(value or "").strip()
    if text.startswith(_ENV_PREFIX):
        return env.get(text[len(_ENV_PREFIX):], "").strip()
    return text


def targets_from_model_list(model_list: Iterable[Mapping[str, Any]],
                            env: Mapping[str, str] | None = None) -> dict[str, ArkTarget]:
    """The first deployment with an API key of each guarded pool (`os.environ/NAME` resolved,
    else `VOLCENGINE_API_KEY` as LiteLLM's chat reads it)."""
    env = os.environ if env is None else env
    found: dict[str, ArkTarget] = {}
    for deployment, guard in guarded_deployments(model_list):
        if guard.pool in found:
            continue
        params = deployment.get("litellm_params") or {}
        key = api_key_of(params, env)
        if not key:
            continue
        base = api_base_of(params, env) or env.get("VOLCENGINE_API_BASE", "").strip() or DEFAULT_API_BASE
        found[guard.pool] = ArkTarget(guard.pool, guard.upstream_model, base.rstrip("/"),
                                      SecretStr(key))
    return found
