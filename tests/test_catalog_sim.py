"""Every catalog kernel in the CPU simulator against its independent NumPy reference."""

import numpy as np
import pytest

from tests.catalog import CASES
from tests.harness import assert_matches, host_copies, launch_config, with_views


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_simulator_matches_numpy(case):
    args, grid, block, shared = case.make(np.random.default_rng(7))
    expected = case.reference(host_copies(args))
    launch_args = with_views(args, case.views)
    case.kernel.sim[launch_config(grid, block, shared)](*launch_args, **case.constexprs)
    for index, want in expected.items():
        assert_matches(f"{case.name} arg {index}", args[index], want, case.rtol, case.atol)
