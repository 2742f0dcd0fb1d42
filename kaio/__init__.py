"""kaio: write GPU kernels in typed Python, compile them to PTX, run them on the GPU through
the CUDA driver (no toolkit) or on the CPU simulator."""

__version__ = "0.1.0"

from kaio.decorators import DeviceFunction, gpu_func, gpu_kernel
from kaio.errors import CompileError, CudaError, LaunchError, OutOfBoundsError, SimulationError
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
