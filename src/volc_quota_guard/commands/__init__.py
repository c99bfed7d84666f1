"""One module per `volc-quota-guard` subcommand (see `cli.py`)."""

from __future__ import annotations

import argparse

from ..gate.keys import validate_pool


def pool_arg(value: str) -> str:
    """argparse type for a pool id, with the validator's message."""
    try:
        return validate_pool(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
