"""``with kaio.simulate():``: route the GPU launches made inside the block to the simulator.

The flag is per Python thread: ``active()`` is what the runtime's launch path checks.
"""

from __future__ import annotations

import contextlib
import threading


class _State(threading.local):
    depth = 0  # a class default: reading it in a fresh thread needs no getattr fallback


_state = _State()


def active() -> bool:
    """True inside a ``with kaio.simulate():`` block (in this Python thread)."""
    return _state.depth > 0


@contextlib.contextmanager
def simulate():
    """Inside the block, every kernel launch and every ``kaio_ops`` call runs on the CPU
    simulator: arguments are NumPy arrays (modified in place) and ops return NumPy arrays.
    Blocks nest."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
