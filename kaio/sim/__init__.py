"""The CPU simulator: runs kernels' typed IR on NumPy arrays with GPU semantics.

- ``kernel.sim[grid, block](*args)`` (``SimLauncher``) runs one kernel;
- ``with kaio.sim.simulate():`` (exported as ``kaio.simulate``) routes every launch inside the
  block to the simulator; ``kaio.sim.mode.active()`` says whether one is open and
  ``kaio.sim.launcher.run_simulated`` runs a routed launch;
- ``simulate_ir(function, grid, block, arrays, scalars)`` runs an IR ``Function`` directly.

See docs/simulator.md.
"""

from kaio.sim.engine import simulate as simulate_ir
from kaio.sim.launcher import SimLauncher, run_simulated
from kaio.sim.mode import active, simulate

__all__ = ["SimLauncher", "active", "run_simulated", "simulate", "simulate_ir"]
