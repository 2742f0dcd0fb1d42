"""Debug kernels and CUDA graph capture (issue 30.6): a kernel in debug mode synchronizes after
each launch to read its bounds-check record, which a capturing stream cannot do, so its
launcher refuses a launch on a capturing stream with a LaunchError, before anything is
captured. On CPU against a fake driver (the launcher's side); marked gpu, with torch's
graph capture."""

from __future__ import annotations

import numpy as np
import pytest

import kaio
from kaio import f32, u32
from kaio.errors import LaunchError
from kaio.runtime import debug as debug_mod
from kaio.runtime.debug import DebugRecord
from tests.test_runtime_cpu import build, fake_device_array, fake_driver  # noqa: F401

NONE, ACTIVE, INVALIDATED = 0, 1, 2


@kaio.gpu_kernel(block_size=64, debug=True)
def scale(x: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * 64
    if i < n:
        out[i] = 2.0 * x[i]


class FakeCu:
    """The driver calls a debug record makes, with a capture status per stream."""

    class CUstreamCaptureStatus:
        CU_STREAM_CAPTURE_STATUS_NONE = NONE

    def __init__(self):
        self.capturing: dict[int, int] = {}
        self.calls: list = []

    def cuStreamIsCapturing(self, stream):
        self.calls.append(("cuStreamIsCapturing", stream))
        return (0, self.capturing.get(stream, NONE))

    def cuStreamSynchronize(self, stream):
        self.calls.append(("cuStreamSynchronize", stream))
        return (0,)

    def cuMemcpyDtoH(self, dst, src, nbytes):
        self.calls.append(("cuMemcpyDtoH", src))
        return (0,)  # the record stays zero: no failed check


@pytest.fixture
def debug_launch(fake_driver, monkeypatch):  # noqa: F811
    """``launch(stream)`` runs ``scale`` through its generated launcher with a real
    ``DebugRecord`` on a fake driver; yields (launch, launches, fake cu)."""
    calls, loaded = fake_driver
    fake = FakeCu()
    monkeypatch.setattr(debug_mod, "cu", fake)
    monkeypatch.setattr(debug_mod, "check", lambda result, what="", stream=None: (
        result[1] if len(result) == 2 else None))  # fmt: skip
    record = DebugRecord.__new__(DebugRecord)
    record.kernel, record.sites, record.pointer = "scale", {}, 0xDEB6
    loaded.debug = record
    dev = loaded.device
    x, out = (fake_device_array(dev, p, (8,), (4,)) for p in (0x1000, 0x2000))
    args = (x, out, 8)
    spec = scale.specialize({}, ("C", "C"))
    bind = build(scale, spec, loaded, args)

    def launch(stream):
        return bind((1, 1, 1), (64, 1, 1), 0, stream)(args)

    return launch, calls, fake


@pytest.mark.parametrize("status", [ACTIVE, INVALIDATED])
def test_debug_kernel_refused_on_a_capturing_stream(debug_launch, status):
    launch, launches, fake = debug_launch
    fake.capturing[0x77] = status
    with pytest.raises(LaunchError, match="debug mode.*capturing a CUDA graph"):
        launch(0x77)
    assert launches == []  # refused before the launch: nothing captured
    assert ("cuStreamSynchronize", 0x77) not in fake.calls  # nor a sync inside the capture


def test_debug_kernel_runs_and_checks_on_a_plain_stream(debug_launch):
    launch, launches, fake = debug_launch
    fake.capturing[0x77] = ACTIVE  # another stream captures: this one is free
    assert launch(0x55)
    assert len(launches) == 1 and launches[0][4] == 0x55
    names = [c[0] for c in fake.calls]
    assert names == ["cuStreamIsCapturing", "cuStreamSynchronize", "cuMemcpyDtoH"]
    assert launch(0x55) and len(launches) == 2  # asked again at every launch
    fake.capturing[0x55] = ACTIVE  # a capture begun after the first launches
    with pytest.raises(LaunchError):
        launch(0x55)
    assert len(launches) == 2


def test_plain_kernel_launcher_never_asks(fake_driver):  # noqa: F811
    """Without debug mode the launcher makes no capture query (nothing added to the hot
    path)."""
    calls, loaded = fake_driver
    plain = kaio.gpu_kernel(block_size=64)(scale.pyfunc)
    dev = loaded.device
    x, out = (fake_device_array(dev, p, (8,), (4,)) for p in (0x1000, 0x2000))
    bind = build(plain, plain.specialize({}, ("C", "C")), loaded, (x, out, 8))
    assert "refuse_capture" not in bind.source and "debug_check" not in bind.source


@pytest.mark.gpu
def test_gpu_debug_kernel_refused_under_torch_graph_capture():
    """On a GPU: torch's capture of a debug kernel raises LaunchError, and the stream and the
    kernel work afterwards outside the capture."""
    torch = pytest.importorskip("torch")
    x = torch.arange(256, dtype=torch.float32, device="cuda")
    out = torch.zeros_like(x)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        scale[4, 64, side.cuda_stream](x, out, 256)  # warm up: compiled and loaded
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(LaunchError, match="capturing a CUDA graph"):
        with torch.cuda.graph(graph, stream=side):
            scale[4, 64, side.cuda_stream](x, out, 256)
    out.zero_()
    scale[4, 64](x, out, 256)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), 2 * np.arange(256, dtype=np.float32))
