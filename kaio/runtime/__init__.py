"""The GPU runtime: the CUDA driver, devices, memory, streams, kernel loading and launching.

Nothing here touches the driver at import time, so kaio imports on machines without a GPU; the
names below are imported on first use (``kaio.lazy``), so that ``import kaio`` loads neither
cuda-bindings nor the PTX emitter.

The public surface is the names of ``__all__``: those ``kaio`` re-exports (``Device``,
``DeviceArray``, ...) and, for libraries built on kaio (``kaio_ops`` uses only these), the
argument descriptions (``describe``, ``ArgInfo``, ``RawArray``, ``torch_dtype``,
``NUMPY_HINT``, ``tensor_check``), the thread's runtime state (``current``), call plans
(``recording``, ``CallPlan``, ``compile_function``, ``recordings``) and the disk cache's
folder (``cache_dir``); docs/runtime.md describes them. The submodules are the implementation.
"""

from kaio.lazy import lazy_names

__all__ = [
    "Device",
    "DeviceArray",
    "Event",
    "Resources",
    "Stream",
    "device",
    "empty",
    "gpu_available",
    "info",
    "synchronize",
    "to_device",
    "zeros",
]
# for libraries on kaio (kaio_ops): not re-exported by ``kaio``
LIBRARY = [
    "ArgInfo",
    "CallPlan",
    "NUMPY_HINT",
    "RawArray",
    "cache_dir",
    "compile_function",
    "current",
    "describe",
    "recording",
    "recordings",
    "tensor_check",
    "torch_dtype",
]
__all__ += LIBRARY

_WHERE = {
    "Device": "kaio.runtime.device",
    "device": "kaio.runtime.device",
    "gpu_available": "kaio.runtime.device",
    "synchronize": "kaio.runtime.device",
    "info": "kaio.runtime.info",
    "DeviceArray": "kaio.runtime.memory",
    "empty": "kaio.runtime.memory",
    "to_device": "kaio.runtime.memory",
    "zeros": "kaio.runtime.memory",
    "Resources": "kaio.runtime.module",
    "Event": "kaio.runtime.stream",
    "Stream": "kaio.runtime.stream",
    "ArgInfo": "kaio.runtime.arginfo",
    "RawArray": "kaio.runtime.arginfo",
    "NUMPY_HINT": "kaio.runtime.arguments",
    "describe": "kaio.runtime.arguments",
    "tensor_check": "kaio.runtime.arguments",
    "torch_dtype": "kaio.runtime.arguments",
    "cache_dir": "kaio.runtime.cache",
    "current": "kaio.runtime.device",
    "recordings": "kaio.runtime.launch",
    "CallPlan": "kaio.runtime.plan",
    "compile_function": "kaio.runtime.plan",
    "recording": "kaio.runtime.plan",
}

__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())
