"""The GPU runtime: the CUDA driver, devices, memory, streams, kernel loading and launching.

Nothing here touches the driver at import time, so kaio imports on machines without a GPU.
"""

from kaio.runtime.device import Device, device, gpu_available, synchronize
from kaio.runtime.info import info
from kaio.runtime.memory import DeviceArray, empty, to_device, zeros
from kaio.runtime.module import Resources
from kaio.runtime.stream import Event, Stream

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
