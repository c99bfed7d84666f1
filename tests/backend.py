"""Which store the tests run on: the real Redis named by VQG_TEST_REDIS_URL, else the embedded one."""

from __future__ import annotations

import os

TEST_REDIS_URL = os.environ.get("VQG_TEST_REDIS_URL") or None
BACKEND = "redis" if TEST_REDIS_URL else "embedded"
