"""Request fields LiteLLM applies after the guard's hook, through a real proxy: refused with a 400
naming the field, before anything reaches Ark (found by a red-team pass)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from proxy_support import MASTER_KEY, Proxy, ark_deployment, call_id, start_syncing_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy
POOL = ("acct-c/ovr-cl-260101", 50_000_000)
BIG_OUT = " [[fake completion=5000 reasoning=20000]]"
DROP = {"additional_drop_params": ["extra_body.max_completion_tokens", "max_output_tokens"]}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
          prefix: str) -> Iterator[Proxy]:
    p = start_syncing_proxy(tmp_path_factory.mktemp("overrides"), fake, store_url, prefix,
                            dict([POOL]), [ark_deployment("ovr-cl", POOL[0])])
    yield p
    stop_proxy(p)


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi" + BIG_OUT}],
                              "max_completion_tokens": 300, **DROP}, "additional_drop_params"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi" + BIG_OUT}],
                              "max_tokens": 300, "n": 3, "stream": True, **DROP}, "additional_drop_params"),
    ("/v1/responses", {"input": "hi" + BIG_OUT, "max_output_tokens": 300, **DROP}, "additional_drop_params"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 300,
                              "extra_body": {"stream": True}}, "extra_body.stream"),
    # A client's own Ark key: LiteLLM lets it override the deployment's, and Ark billed 2,318
    # tokens to another account than the one the guard reserved in (red team, stop 30).
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "api_key": "ark-acct-a"},
     "api_key"),
    ("/v1/responses", {"input": "hi", "api_key": "ark-acct-a", "stream": True}, "api_key"),
    ("/v1/embeddings", {"input": "hi", "api_key": "ark-acct-a"}, "api_key"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "extra_headers": {"authorization": "Bearer ark-acct-a"}},
     "extra_headers.authorization"),
], ids=["drop-chat", "drop-chat-n3-stream", "drop-responses", "extra-body-stream", "key-chat",
        "key-responses-stream", "key-embeddings", "key-header"])
def test_fields_applied_after_the_hook_are_refused(proxy: Proxy, path: str, body: dict[str, Any],
                                                   field: str) -> None:
    """additional_drop_params stripped the pinned cap (24,115 tokens consumed against 430 reserved),
    extra_body.stream made a retried 5xx, and a client's own key billed another account: each is
    now a 400 naming the field, nothing upstream."""
    before = len(proxy.fake.upstream_requests())
    r = httpx.post(f"{proxy.url}{path}", json={"model": "ovr-cl", **body}, timeout=60,
                   headers={"Authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": call_id()})
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert field in r.text
    assert proxy.fake.upstream_requests()[before:] == []
