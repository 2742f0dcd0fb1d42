"""``with kaio.simulate():``: route the GPU launches made inside the block to the simulator.

The flag is per Python thread. Its count of open blocks lives in ``kaio.runtime.device.current``
(``simulating``), next to the current device, since every launch reads both.
"""

from __future__ import annotations

import contextlib
import threading

from kaio.runtime.device import current

# Open simulate() blocks in all threads: code on a hot path (kaio_ops' call plans) reads this
# module global first and the thread-local count only while some block is open
anywhere = [0]
_COUNT = threading.Lock()


def active() -> bool:
    """True inside a ``with kaio.simulate():`` block (in this Python thread)."""
    return current.simulating > 0


@contextlib.contextmanager
def simulate():
    """Inside the block, every kernel launch and every ``kaio_ops`` call runs on the CPU
    simulator: arguments are NumPy arrays (modified in place) and ops return NumPy arrays.
    Blocks nest."""
    current.simulating += 1
    with _COUNT:
        anywhere[0] += 1
    try:
        yield
    finally:
        current.simulating -= 1
        with _COUNT:
            anywhere[0] -= 1
