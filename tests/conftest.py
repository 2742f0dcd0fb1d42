"""Shared test setup: tests marked ``gpu`` run only where a CUDA driver and a GPU are usable;
tests marked ``slow`` (long runs) only when selected (``-m slow``)."""

from __future__ import annotations

import pytest

from kaio.runtime.device import gpu_unavailable_reason


def pytest_collection_modifyitems(config, items) -> None:
    if "slow" not in (config.getoption("markexpr", "") or ""):
        skip_slow = pytest.mark.skip(reason="a long run: select it with -m slow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip_slow)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason is not None:
        skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_plans_from_earlier_tests():
    """Each test starts with no kaio_ops call plans: a test that patches an op's internals
    (to count its launches, say) must see the op's body run, not a plan an earlier test
    built for the same signature."""
    import sys

    plans = sys.modules.get("kaio_ops._plan")
    if plans is not None:
        plans.clear()
    yield
