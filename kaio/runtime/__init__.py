"""The GPU runtime: the CUDA driver, devices, memory, streams, kernel loading and launching.

Nothing here touches the driver at import time, so kaio imports on machines without a GPU; the
names below are imported on first use (``kaio.lazy``), so that ``import kaio`` loads neither
cuda-bindings nor the PTX emitter.
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
}

__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())
