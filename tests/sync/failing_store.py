"""A store client whose chosen commands fail the way redis-py fails when Redis goes away."""

from __future__ import annotations

from typing import Any

import redis


class FailingCommands:
    """Delegates to `client`, except that the commands named in `failing` raise redis-py's
    `ConnectionError` (which is not Python's built-in `ConnectionError`)."""

    def __init__(self, client: redis.Redis, *failing: str) -> None:
        self._client = client
        self.failing = set(failing)

    def __getattr__(self, name: str) -> Any:
        if name in self.failing:
            def fail(*args: object, **kwargs: object) -> None:
                raise redis.ConnectionError(f"Error 111 connecting to the store ({name})")

            return fail
        return getattr(self._client, name)
