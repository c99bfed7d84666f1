"""Volcengine credentials per account, from the environment.

The account ``default`` reads ``VOLC_ACCESSKEY`` / ``VOLC_SECRETKEY``; an account ``team-b``
reads ``VOLC_ACCESSKEY_TEAM_B`` / ``VOLC_SECRETKEY_TEAM_B`` (upper-cased, ``-`` → ``_``).
The secret key lives in a pydantic ``SecretStr`` so no repr, str or log line shows it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import SecretStr

from ..errors import ConfigError

DEFAULT_ACCOUNT = "default"
_ACCOUNT_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


@dataclass(frozen=True)
class Credentials:
    """One account's access key pair. ``secret_key`` never prints."""

    account: str
    access_key: str
    secret_key: SecretStr

    def __repr__(self) -> str:
        return f"Credentials(account={self.account!r}, access_key={mask(self.access_key)!r})"

    __str__ = __repr__


def mask(access_key: str) -> str:
    """Enough of an access key to tell two apart in a log line, not enough to use it."""
    return access_key[:4] + "…" + access_key[-4:] if len(access_key) > 12 else "…"


def env_names(account: str) -> tuple[str, str]:
    """The (access key, secret key) variable names an account reads."""
    if not _ACCOUNT_RE.match(account):
        raise ConfigError(f"bad account name {account!r}: use letters, digits, '.', '_', '-'")
    if account == DEFAULT_ACCOUNT:
        return "VOLC_ACCESSKEY", "VOLC_SECRETKEY"
    suffix = account.upper().replace("-", "_").replace(".", "_")
    return f"VOLC_ACCESSKEY_{suffix}", f"VOLC_SECRETKEY_{suffix}"


def load_credentials(account: str = DEFAULT_ACCOUNT,
                     env: Mapping[str, str] | None = None) -> Credentials:
    """Read an account's key pair; a missing half is a ConfigError naming the variable."""
    env = os.environ if env is None else env
    ak_name, sk_name = env_names(account)
    ak = env.get(ak_name, "").strip()
    sk = env.get(sk_name, "").strip()
    if account == DEFAULT_ACCOUNT and not (ak or sk):
        # `default` may also be spelled like any other account.
        ak_name, sk_name = "VOLC_ACCESSKEY_DEFAULT", "VOLC_SECRETKEY_DEFAULT"
        ak = env.get(ak_name, "").strip()
        sk = env.get(sk_name, "").strip()
    missing = [name for name, value in ((ak_name, ak), (sk_name, sk)) if not value]
    if missing:
        raise ConfigError(
            f"no Volcengine credentials for account {account!r}: set {' and '.join(missing)}"
        )
    return Credentials(account=account, access_key=ak, secret_key=SecretStr(sk))
