"""A world for sync tests: the fake Volcengine over HTTP, the gate on the test backend, one clock."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redis

from volc_quota_guard.clock import BEIJING, ManualClock
from volc_quota_guard.config import Settings, load_settings
from volc_quota_guard.fake import FakeVolcengine, Ledger
from volc_quota_guard.gate import Gate
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.sync import SyncService
from volc_quota_guard.volcengine.billing import BillingClient
from volc_quota_guard.volcengine.packages import PoolSpec

ACCOUNT = "acct-a"
POOL = f"{ACCOUNT}/deepseek-v4-flash-ga-260731"
ENV = {"VOLC_ACCESSKEY_ACCT_A": "AKLTacctafake0001", "VOLC_SECRETKEY_ACCT_A": "c2VjcmV0LWZha2UtYQ=="}
MIN = 60_000
IDLE_ACCOUNT_ADMIT = 10**9  # VQG_COLD_START_ADMIT_TOKENS of a world whose account was idle


def beijing_ms(text: str) -> int:
    """'2026-08-13 09:00' in Beijing time, as ms since the epoch."""
    from datetime import datetime

    return int(datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=BEIJING).timestamp() * 1000)


@dataclass
class World:
    clock: ManualClock
    fake: FakeVolcengine
    gate: Gate
    cfg: Settings
    keyspace: KeySpace
    client: redis.Redis
    served: int = 0
    refused: int = 0
    seq: int = 0
    services: list[SyncService] = field(default_factory=list)

    def service(self) -> SyncService:
        """A sync service as one proxy process would run it (its own gate object, same store)."""
        def lister(account: str) -> BillingClient:
            return BillingClient.for_account(account, config=self.cfg, env=ENV, wait_initial=0.01,
                                             wait_max=0.02, wait_jitter=0.0, attempts=3, page_interval=0)

        svc = SyncService(self.cfg, Gate(self.client, self.keyspace, self.clock),
                          lambda: [PoolSpec(POOL)], lister)
        self.services.append(svc)
        return svc

    def request(self, tokens: int, duration_ms: int = 20_000) -> bool:
        """One request of `tokens` (estimated exactly): reserve, run upstream, settle."""
        self.seq += 1
        rid = f"req-{self.seq}"
        d = self.gate.reserve(POOL, rid, tokens)
        if not d.admitted:
            self.refused += 1
            return False
        self.clock.advance(duration_ms)
        self.fake.consume(POOL, tokens)
        self.gate.settle(POOL, rid, tokens)
        self.served += tokens
        return True

    def run(self, until: str, every_ms: int, tokens: int, svc: SyncService,
            budget: int | None = None) -> None:
        """Steady traffic until a Beijing time (or `budget` served), the sync ticking before each."""
        end = beijing_ms(until)
        while self.clock.now_ms() < end and (budget is None or self.served + tokens <= budget):
            started = self.clock.now_ms()
            svc.tick()
            self.request(tokens)
            self.clock.set(max(self.clock.now_ms(), started + every_ms))

    def idle(self, until: str, svc: SyncService, step_ms: int = MIN) -> None:
        end = beijing_ms(until)
        while self.clock.now_ms() < end:
            svc.tick()
            self.clock.advance(step_ms)

    def totals(self):
        return self.fake.pool_totals(POOL)


@pytest.fixture
def make_world(client: redis.Redis, keyspace: KeySpace) -> Iterator:
    fakes: list[FakeVolcengine] = []

    def make(start: str, lag_minutes: float = 14, **settings: object) -> World:
        clock = ManualClock(beijing_ms(start))
        fake = FakeVolcengine({ACCOUNT: (ENV["VOLC_ACCESSKEY_ACCT_A"], ENV["VOLC_SECRETKEY_ACCT_A"])},
                              ledger=Ledger(lag_minutes=lag_minutes), clock=clock).start()
        fakes.append(fake)
        # These worlds start on an account with nothing unsettled (the guard "was there"): the
        # operator's cold-start allowance lets the first sync serve at once. The hold itself is
        # what tests/sync/test_history.py and tests/faults/test_state_faults.py test.
        settings.setdefault("cold_start_admit_tokens", IDLE_ACCOUNT_ADMIT)
        settings.setdefault("unseen_day_tokens", 0)
        cfg = load_settings(billing_endpoint=fake.url, **settings)
        ks = KeySpace(f"{keyspace.prefix}:w{len(fakes)}")  # a fresh pool per world, cleaned with the rest
        return World(clock, fake, Gate(client, ks, clock), cfg, ks, client)

    yield make
    for fake in fakes:
        fake.stop()
