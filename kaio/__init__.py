"""kaio: write GPU kernels in typed Python, compile them to PTX, run them on the GPU through
the CUDA driver (no toolkit) or on the CPU simulator."""

__version__ = "0.1.0"

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
from kaio.runtime import (
    Device,
    DeviceArray,
    Event,
    Stream,
    device,
    empty,
    gpu_available,
    synchronize,
    to_device,
    zeros,
)
from kaio.sim import simulate
from kaio.tensormap import TensorMap, tensor_map_2d
from kaio.types import (
    ArrayType,
    ScalarType,
    bf16,
    bf16x2,
    bool_,
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

# `from kaio import *` exports every public name except the builtins that share a name with
# Python's (abs, min, max, pow): star-importing kaio must not change what host code's abs()
# means. In kernels write kaio.abs(x) or plain abs(x): the frontend maps Python's builtins to
# kaio's. (Add a name here when a new kaio builtin shadows a Python one.)
_NOT_STARRED = {"abs", "max", "min", "pow"}
__all__ = sorted(n for n in list(globals()) if not n.startswith("_") and n not in _NOT_STARRED)
