"""The CPU simulator: runs kernels' typed IR on NumPy arrays with GPU semantics.

- ``kernel.sim[grid, block](*args)`` (``SimLauncher``) runs one kernel;
- ``with kaio.sim.simulate():`` (exported as ``kaio.simulate``) routes every launch inside the
  block to the simulator; ``kaio.sim.active()`` says whether one is open on this thread,
  ``kaio.sim.anywhere[0]`` counts those open on any thread (a cheap test before ``active``)
  and ``kaio.sim.run_simulated`` runs a routed launch;
- ``simulate_ir(function, grid, block, arrays, scalars)`` runs an IR ``Function`` directly.

See docs/simulator.md.
"""

from kaio.lazy import lazy_names

__all__ = ["SimLauncher", "active", "anywhere", "run_simulated", "simulate", "simulate_ir"]

# Imported on first use (``kaio.lazy``): ``import kaio`` needs only ``mode``, not the engine.
_WHERE = {
    "simulate_ir": "kaio.sim.engine:simulate",
    "SimLauncher": "kaio.sim.launcher",
    "run_simulated": "kaio.sim.launcher",
    "active": "kaio.sim.mode",
    "anywhere": "kaio.sim.mode",
    "simulate": "kaio.sim.mode",
}

__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())
