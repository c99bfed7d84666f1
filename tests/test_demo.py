"""The README's main job: `volc-quota-guard demo`, through its CLI entry point."""

from __future__ import annotations

import re

import pytest

from backend import TEST_REDIS_URL
from volc_quota_guard.cli import main

pytestmark = pytest.mark.proxy


def test_demo_serves_blocks_and_bills_nothing(monkeypatch, capsys):
    """A shortened demo serves traffic through a real proxy, blocks at the walls and bills 0."""
    if TEST_REDIS_URL:
        monkeypatch.setenv("VQG_REDIS_URL", TEST_REDIS_URL)  # CI: the real server, as users would
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["demo", "--seconds", "60"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"billed tokens \(fake Volcengine ledger\)\s*│\s*0 │", out), out
    served = int(re.search(r"requests served\s*│\s*([\d,]+)", out).group(1).replace(",", ""))
    blocked = int(re.search(r"requests blocked \(HTTP 429\)\s*│\s*([\d,]+)", out).group(1).replace(",", ""))
    assert served > 100 and blocked > 0
    assert "🚫 [PRE-BLOCK]" in out and "OK: free quota used, nothing billed." in out
