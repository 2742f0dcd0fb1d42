"""kaio: write GPU kernels in typed Python, compile them to PTX, run them on the GPU through
the CUDA driver (no toolkit) or on the CPU simulator."""

__version__ = "0.1.0"

from types import ModuleType

from kaio.decorators import DeviceFunction, gpu_func, gpu_kernel
from kaio.errors import (
    CompileError,
    CudaError,
    KaioWarning,
    LaunchError,
    OutOfBoundsError,
    SimulationError,
    UnsignedComparisonWarning,
)
from kaio.kernel import Kernel, constexpr
from kaio.lang import *  # noqa: F403  (the DSL builtins: thread_idx_x, shared, exp, ...)
from kaio.lang import static_range
from kaio.lazy import lazy_names
from kaio.runtime import _WHERE as _runtime_where
from kaio.sim.mode import simulate
from kaio.tensormap import TensorMap, tensor_map_2d
from kaio.types import (
    ArrayType,
    ScalarType,
    bf16,
    bf16x2,
    bool_,
    e4m3,
    e5m2,
    f8e4m3,
    f8e5m2,
    f16,
    f16x2,
    f32,
    f64,
    i8,
    i16,
    i32,
    i64,
    tensormap,
    u8,
    u16,
    u32,
    u64,
)

# The runtime's names are imported on first use, so that ``import kaio`` loads neither
# cuda-bindings nor the PTX emitter (``kaio.lazy``); ``kaio.Device`` and
# ``from kaio import Device`` work as if they were imported here.
_RUNTIME = (
    "Device",
    "DeviceArray",
    "Event",
    "Stream",
    "device",
    "empty",
    "gpu_available",
    "synchronize",
    "to_device",
    "zeros",
)
# Each name points at its defining module, not at ``kaio.runtime``: once the submodule
# ``kaio.runtime.device`` is imported, the package attribute ``device`` is that module.
__getattr__, __dir__ = lazy_names(
    __name__, {name: _runtime_where[name] for name in _RUNTIME}, globals()
)
# ``from kaio import *``: the public names, the lazy ones included (not the submodules), except
# the builtins that share a name with Python's (abs, min, max, pow): star-importing kaio must
# not change what host code's abs() means. In kernels write kaio.abs(x) or plain abs(x): the
# frontend maps Python's builtins to kaio's. (Add a name here when a new kaio builtin shadows
# a Python one.)
_NOT_STARRED = {"abs", "max", "min", "pow"}
__all__ = sorted(
    {n for n, v in globals().items() if not n.startswith("_") and not isinstance(v, ModuleType)}
    - {"lazy_names", "ModuleType"}
    - _NOT_STARRED
    | set(_RUNTIME)
)
