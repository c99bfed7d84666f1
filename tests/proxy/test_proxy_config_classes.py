"""Deployments and request fields that let Ark traffic pass unsized, through a real proxy (two
red-team passes): Ark behind another provider, a `*` wildcard, one account under two pools (a
shared API key, two spellings of its credentials), a deployment's own prompt template; fields on
which LiteLLM adds to the messages after the hook (a continue message between turns: 277
reserved, 72,757 consumed; its own system prompt; retrieval; a prompt not in the proxy's
registry). Each billed on the fake before; now each is a 400 naming the cause, nothing reaches Ark."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from proxy_support import MASTER_KEY, Proxy, ark_deployment, call_id, start_proxy, stop_proxy, sync_env

from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy

ARK = "os.environ/VOLCENGINE_API_BASE"
POOLS = ("acct-c/cc-oa-260101", "acct-c/cc-star-260101", "acct-a/cc-key-260101",
         "acct-b/cc-key-260101", "acct-d/cc-dup-260101", "acct-c/cc-pm-260101", "acct-c/cc-ok-260101")
PROMPT = "Answer with care. " * 2500


def deployments() -> list[dict[str, Any]]:
    key_a = ark_deployment("cc-key", "acct-a/cc-key-260101")
    key_b = ark_deployment("cc-key", "acct-b/cc-key-260101")
    for dep in (key_a, key_b):  # a copy-paste slip: one account's key under two accounts
        dep["litellm_params"]["api_key"] = "ark-key-of-one-account"
    dup = ark_deployment("cc-dup", "acct-d/cc-dup-260101")
    dup_too = ark_deployment("cc-dup", "acct-d/cc-dup-260101")
    dup_too["model_info"] |= {"id": "cc-dup@acct_d", "vqg_account": "acct_d"}
    for dep in (dup, dup_too):
        dep["litellm_params"]["api_key"] = "ark-key-of-acct-d"
    pm = ark_deployment("cc-pm", "acct-c/cc-pm-260101")
    pm["litellm_params"] |= {"prompt_id": "cc-big", "prompt_variables": {"q": "x"}}
    return [
        {"model_name": "cc-oa",
         "litellm_params": {"model": "openai/cc-oa-260101", "api_base": ARK,
                            "api_key": "os.environ/ARK_API_KEY_ACCT_C"},
         "model_info": {"id": "cc-oa@acct-c"}},
        {"model_name": "*", "litellm_params": {"model": "*"}, "model_info": {"id": "star"}},
        key_a, key_b, dup, dup_too, pm,
        ark_deployment("cc-ok", "acct-c/cc-ok-260101"),
    ]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
          prefix: str) -> Iterator[Proxy]:
    for pool in POOLS:
        fake.add_package(pool, 20_000)

    def config(data: dict[str, Any]) -> dict[str, Any]:
        data["model_list"] += deployments()
        template = f"---\n---\nSystem: {PROMPT}\nUser: x\n"
        data["prompts"] = [{"prompt_id": "cc-big", "prompt_info": {"prompt_type": "config"},
                            "litellm_params": {"prompt_id": "cc-big", "prompt_integration": "dotprompt",
                                               "dotprompt_content": template}}]
        return data

    p = start_proxy(tmp_path_factory.mktemp("config-classes"), fake, store_url, prefix,
                    env=sync_env(fake, VOLCENGINE_API_KEY="ark-acct-c"), config=config)
    p.wait_for_log(r"\[Sync\] acct-c/cc-ok-260101: Bal=20,000", timeout=60)
    yield p
    stop_proxy(p)


def post(proxy: Proxy, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "max_tokens": 3000, "thinking": {"type": "disabled"},
            "messages": [{"role": "user", "content": "hello [[fake completion=3000]]"}], **extra}
    return httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": call_id()})


@pytest.mark.parametrize(("model", "pools", "cause"), [
    ("cc-oa", ["acct-c/cc-oa-260101"], "through provider 'openai'"),
    ("volcengine/cc-star-260101", ["acct-c/cc-star-260101"], "goes to Ark"),
    ("cc-key", ["acct-a/cc-key-260101", "acct-b/cc-key-260101"], "share one Ark API key"),
    ("cc-dup", ["acct-d/cc-dup-260101"], "read the same Volcengine credentials"),
    ("cc-pm", ["acct-c/cc-pm-260101"], "litellm_params.prompt_id"),
])
def test_a_deployment_ark_would_bill_unsized_is_refused_naming_why(
        proxy: Proxy, model: str, pools: list[str], cause: str) -> None:
    for _ in range(3):
        r = post(proxy, model)
        assert r.status_code == 400, r.text
        assert cause in r.text
    for pool in pools:
        assert proxy.fake.pool_totals(pool).consumed == 0


def test_startup_names_the_deployments_it_cannot_sync(proxy: Proxy) -> None:
    for name in ("cc-oa@acct-c", "cc-key@acct-a", "cc-key@acct-b", "cc-dup@acct_d", "cc-pm@acct-c"):
        proxy.wait_for_log(rf"deployment skipped.*{name}", timeout=10)


BIG = "lorem ipsum dolor sit amet " * 400
TURNS = [{"role": "user", "content": "hi"}] * 30
CONTINUE = {"role": "assistant", "content": BIG}


@pytest.mark.parametrize(("path", "field", "extra"), [
    ("chat", "assistant_continue_message", {"messages": TURNS, "assistant_continue_message": CONTINUE}),
    ("chat", "ensure_alternating_roles", {"ensure_alternating_roles": True, "messages": TURNS}),
    ("chat", "user_continue_message", {"user_continue_message": {"role": "user", "content": BIG}}),
    ("chat", "litellm_system_prompt", {"litellm_system_prompt": BIG * 5}),
    ("chat", "vector_store_ids", {"vector_store_ids": ["vs-1"]}),
    ("chat", "prompt_id", {"prompt_id": "not-in-the-registry", "prompt_variables": {"q": BIG}}),
    ("messages", "litellm_system_prompt", {"litellm_system_prompt": BIG * 5}),
    ("messages", "ensure_alternating_roles", {"ensure_alternating_roles": True, "messages": TURNS,
                                              "assistant_continue_message": CONTINUE}),
])
def test_fields_litellm_turns_into_messages_after_the_hook_are_refused(
        proxy: Proxy, path: str, field: str, extra: dict[str, Any]) -> None:
    if path == "chat":
        r = post(proxy, "cc-ok", **extra)
    else:
        body = {"model": "cc-ok", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **extra}
        r = httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": call_id()})
    assert r.status_code == 400 and field in r.text, r.text
    assert proxy.fake.pool_totals("acct-c/cc-ok-260101").consumed == 0


def test_a_plain_call_on_the_same_deployment_serves(proxy: Proxy) -> None:
    assert post(proxy, "cc-ok", max_tokens=50).status_code == 200
