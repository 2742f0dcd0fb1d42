"""Which kernels an op launches: ``launched(monkeypatch)`` returns a list that gets every
kernel subscripted for a launch (``kernel[config]``) from then on, in order."""

from __future__ import annotations

import kaio


def launched(monkeypatch) -> list:
    """The list of kernels launched (subscripted) after this call, for the test's duration."""
    kernels: list = []
    kernel_type = type(kaio.gpu_kernel(lambda x: None))
    subscript = kernel_type.__getitem__

    def counted(kernel, config):
        kernels.append(kernel)
        return subscript(kernel, config)

    monkeypatch.setattr(kernel_type, "__getitem__", counted)
    return kernels
