"""LiteLLM's pass-through routes against guarded deployments: nothing reaches Ark unreserved.

A pass-through route forwards the body as is: a router model's call (`/vllm`, `/azure`,
`/bedrock`) is refused by the deployment hook, and a provider base pointed at Ark
(`OPENAI_API_BASE` …) refuses every pass-through call (red-team pass, stop 34: `/openai`,
`/openai_passthrough` and `/mistral` sent to Ark with no reservation, billed by the fake)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from proxy_support import MASTER_KEY, Proxy, ark_deployment, call_id, start_syncing_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine
from volc_quota_guard.proxy.deployments import pass_through_to_ark

pytestmark = pytest.mark.proxy
POOL = ("acct-c/pt-guarded-260101", 60_000)
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}


def start(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
          prefix: str, pool: tuple[str, int], **env: str) -> Proxy:
    return start_syncing_proxy(tmp_path_factory.mktemp("pt"), fake, store_url, prefix, dict([pool]),
                               [ark_deployment("pt-guarded", pool[0])], VQG_SMALL_BUFFER="10000",
                               **env)


def post(px: Proxy, path: str, model: str) -> httpx.Response:
    return httpx.post(f"{px.url}{path}", json={"model": model, **BODY}, timeout=60,
                      headers={"Authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": call_id()})


@pytest.fixture(scope="module")
def px(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
       prefix: str) -> Iterator[Proxy]:
    p = start(tmp_path_factory, fake, store_url, prefix, POOL)
    yield p
    stop_proxy(p)


@pytest.mark.parametrize(("path", "refusal"), [
    ("/vllm/chat/completions", "allm_passthrough_route"),
    ("/azure/chat/completions", "allm_passthrough_route"),
    ("/bedrock/model/pt-guarded/converse", "allm_passthrough_route"),
    ("/mistral/v1/chat/completions", "pass_through_endpoint"),
    ("/openrouter/chat/completions", "pass_through_endpoint"),
    ("/v1/completions", "atext_completion"),
])
def test_a_pass_through_call_to_a_guarded_model_is_a_400_naming_the_route(px: Proxy, path: str,
                                                                          refusal: str) -> None:
    before = px.fake.pool_totals(POOL[0]).consumed
    r = post(px, path, "pt-guarded")
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert f"this route ({refusal}) is not served" in r.text
    assert px.fake.pool_totals(POOL[0]).consumed == before


@pytest.mark.parametrize("path", ["/openai/chat/completions", "/openai_passthrough/chat/completions"])
def test_a_provider_base_pointed_at_ark_refuses_pass_through_calls(
        tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
        prefix: str, path: str) -> None:
    """OPENAI_API_BASE at Ark with an Ark key: LiteLLM's /openai route would send the raw Ark
    model there, outside every guarded deployment, and Ark would bill it."""
    n = path.count("passthrough")  # a pool and a key space of its own per proxy (the sync's lease)
    pool = (f"acct-c/pt-env{n}-260101", 60_000)
    p = start(tmp_path_factory, fake, store_url, f"{prefix}:env{n}", pool,
              OPENAI_API_BASE=fake.ark_base_url, OPENAI_API_KEY="ark-acct-c")
    try:
        before = fake.pool_totals(pool[0]).consumed
        r = post(p, path, pool[0].split("/")[1])
        assert r.status_code == 400, (r.status_code, r.text[:300])
        assert "OPENAI_API_BASE points LiteLLM's pass-through routes at Ark" in r.text
        assert fake.pool_totals(pool[0]).consumed == before
        p.wait_for_log(r"⛔ \[PASS-THROUGH\] refused: OPENAI_API_BASE")
        assert post(p, "/v1/chat/completions", "pt-guarded").status_code == 200
    finally:
        stop_proxy(p)


@pytest.mark.parametrize(("env", "settings", "bases", "found"), [
    ({"MISTRAL_API_BASE": "https://ark.cn-beijing.volces.com/api/v3"}, None, (), "MISTRAL_API_BASE"),
    ({"OPENAI_BASE_URL": "https://gw.example/api/v3"}, None, ["https://gw.example/api/v3/"],
     "OPENAI_BASE_URL"),
    ({"OPENAI_API_BASE": "https://api.openai.com"}, None, ["https://gw.example"], None),
    # Ark's own names and this package's are not a pass-through route's base.
    ({"VOLCENGINE_API_BASE": "https://ark.cn-beijing.volces.com/api/v3",
      "ARK_BASE_URL": "https://ark.cn-beijing.volces.com/api/v3",
      "VQG_BILLING_ENDPOINT": "https://open.volcengineapi.com"}, None, (), None),
    ({"ARK": "https://ark.ap-southeast.bytepluses.com"},
     {"pass_through_endpoints": [{"path": "/x", "target": "https://api.example"},
                                 {"path": "/ark", "target": "os.environ/ARK_TARGET"}]},
     ["https://ark.example"], None),
    ({"ARK_TARGET": "https://ark.cn-beijing.volces.com/api/v3/chat/completions"},
     {"pass_through_endpoints": [{"path": "/x", "target": "https://api.example"},
                                 {"path": "/ark", "target": "os.environ/ARK_TARGET"}]},
     (), "general_settings.pass_through_endpoints[1].target"),
])
def test_pass_through_to_ark_names_the_variable_or_route(env: dict[str, str], settings: Any,
                                                         bases: Any, found: str | None) -> None:
    assert pass_through_to_ark(env, settings, bases) == found
