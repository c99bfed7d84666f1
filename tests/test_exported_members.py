"""The public names: `__all__` of the package and of `gate` is exactly what they define or hand on."""

from __future__ import annotations

import pytest

import volc_quota_guard
from volc_quota_guard import gate


@pytest.mark.parametrize("module", [volc_quota_guard, gate], ids=lambda m: m.__name__)
def test_all_is_exactly_the_public_names(module):
    """Every public name of the module is in `__all__`, and every name in `__all__` resolves."""
    public = {name for name in vars(module) if not name.startswith("_")}
    public -= {"annotations", "TYPE_CHECKING"}  # `from __future__` / typing plumbing
    public -= {m for m in public if type(vars(module)[m]).__name__ == "module"}  # subpackages
    lazy = {"proxy_handler_instance"}  # the LiteLLM callback, built on first use (__getattr__)
    assert sorted(public | (lazy & set(module.__all__))) == sorted(module.__all__)
    if module is gate:
        assert all(hasattr(module, name) for name in module.__all__)


def test_every_error_is_under_the_root_and_exported():
    """Each exception class of errors.py derives from QuotaGuardError and is exported."""
    from volc_quota_guard import errors

    classes = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)}
    assert all(issubclass(getattr(errors, n), errors.QuotaGuardError) for n in classes)
    assert classes <= set(volc_quota_guard.__all__)
