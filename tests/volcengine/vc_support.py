"""Shared constants and helpers for the Volcengine tests (imported by conftest and tests)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import httpx
from pydantic import SecretStr

from volc_quota_guard.clock import BEIJING
from volc_quota_guard.fake import FakeVolcengine
from volc_quota_guard.volcengine.accounts import Credentials
from volc_quota_guard.volcengine.billing import BillingClient

T0 = int(datetime(2026, 8, 13, 8, 0, tzinfo=BEIJING).timestamp() * 1000)
ACCOUNTS = {
    "acct-a": ("AKLTacctA000000000001", "secret-A-do-not-leak", "ark-key-a"),
    "acct-b": ("AKLTacctB000000000002", "secret-B-do-not-leak", "ark-key-b"),
}
POOL_A = "acct-a/deepseek-v4-flash-ga-260731"


def creds(account: str = "acct-a", secret: str | None = None) -> Credentials:
    ak, sk, _ = ACCOUNTS[account]
    return Credentials(account, ak, SecretStr(secret or sk))



def client_for(fake: FakeVolcengine, account: str = "acct-a", secret: str | None = None,
               **kwargs: object) -> BillingClient:
    """A billing client on the fake with millisecond backoff, so retry tests stay fast."""
    options: dict[str, object] = dict(endpoint=fake.url, page_interval=0, attempts=4,
                                      wait_initial=0.01, wait_max=0.02, wait_jitter=0.005)
    options.update(kwargs)
    return BillingClient(creds(account, secret), **options)  # type: ignore[arg-type]


# The Ark data plane over HTTP

HTTP = httpx.Client(timeout=10)  # one client: building one per call costs ~40 ms

MODEL = "deepseek-v4-flash-ga-260731"
AUTH = {"Authorization": "Bearer ark-key-a"}


def chat(fake: FakeVolcengine, text: str, **body: Any) -> httpx.Response:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": text}], **body}
    return HTTP.post(f"{fake.ark_base_url}/chat/completions", json=payload, headers=AUTH,
                      timeout=10)


def sse_events(response: httpx.Response) -> list[Any]:
    out: list[Any] = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out
