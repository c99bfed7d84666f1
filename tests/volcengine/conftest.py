"""Fixtures for the Volcengine side: a fake Volcengine on an ephemeral port, on a manual clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from vc_support import ACCOUNTS, T0

from volc_quota_guard.clock import ManualClock
from volc_quota_guard.fake import FakeVolcengine, Ledger


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def fake(clock: ManualClock) -> Iterator[FakeVolcengine]:
    """A running fake with accounts acct-a/acct-b, the standard noise packages and a 14-min lag."""
    with FakeVolcengine(ACCOUNTS, ledger=Ledger(lag_minutes=14), clock=clock) as f:
        yield f


@pytest.fixture
def quiet_fake(clock: ManualClock) -> Iterator[FakeVolcengine]:
    """A running fake that lists only the ledger's packages (no noise)."""
    with FakeVolcengine(ACCOUNTS, clock=clock, noise=False) as f:
        yield f
