"""Two proxy worker processes share one store: the walls hold across processes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from proxy_support import MASTER_KEY, POOL_SOLO, Proxy, call_id, start_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
            prefix: str) -> Iterator[Proxy]:
    """A proxy started with `--num_workers 2`."""
    p = start_proxy(tmp_path_factory.mktemp("workers"), fake, store_url, prefix,
                    # uvicorn kills a worker that does not answer its health check in 5 s, and
                    # importing LiteLLM takes longer than that on a busy 2-core machine.
                    args=("--num_workers", "2", "--timeout_worker_healthcheck", "120"))
    yield p
    stop_proxy(p)


def test_two_workers_share_one_wall(workers: Proxy) -> None:
    """Concurrent requests spread over two workers never push the shared pool past its wall."""
    headroom = 6_000
    workers.seed(POOL_SOLO, headroom)
    workers.fake.clear_chat_requests()

    def one(i: int) -> tuple[str, int]:
        cid = call_id()
        with httpx.Client(timeout=60) as http:  # a connection each: requests spread over workers
            return cid, http.post(f"{workers.url}/v1/chat/completions",
                                  headers={"authorization": f"Bearer {MASTER_KEY}",
                                           "x-litellm-call-id": cid},
                                  json={"model": "solo", "max_tokens": 500, "messages": [
                                      {"role": "user", "content": f"r{i} [[fake completion=500]]"}]},
                                  ).status_code

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(32)))
    codes = [code for _, code in results]
    assert set(codes) <= {200, 429} and codes.count(200) >= 8, codes
    pids = set()
    for cid, code in results:  # each request's Usage (admitted) or PRE-BLOCK (refused) line
        kind = r"\[Usage\]" if code == 200 else r"\[PRE-BLOCK\]"
        line = workers.wait_for_log(rf"{kind}.*call={cid}")[0]
        pids.add(re.search(r"volc_quota_guard\[(\d+)\]", line).group(1))
    assert len(pids) == 2, pids  # both worker processes guarded requests
    consumed = sum(r.consumed for r in workers.fake.chat_requests())
    d = workers.state(POOL_SOLO).decision
    assert consumed <= headroom and d.used_balance <= d.balance_wall and d.inflight == 0
