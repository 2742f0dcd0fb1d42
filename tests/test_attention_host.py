"""The host path of the Hopper attention forward on the CPU, against a fake driver: the TMA
tensor maps' bytes are kept per address and layout (``kaio.tensormap.MAPS_KEPT``), so that
``_attention_hopper.launch`` called again on the same arrays encodes nothing, while a new
address, shape, row stride, dtype, box or swizzle always gets a map of its own (never a
stale one); ``flash_attention`` routed to the kernel launches the same bytes planned and
unplanned, and its checks still raise."""

from __future__ import annotations

import importlib
import types

import pytest

import kaio
import kaio_ops
from kaio import bf16, f16, f32, i32
from kaio.runtime import RawArray
from kaio_ops import _arrays, _plan, attention
from kaio_ops import _attention_hopper as hopper
from tests.test_plans import fake  # noqa: F401  (the fake GPU fixture)

tensormap = importlib.import_module("kaio.tensormap")  # the module, not the annotation


@pytest.fixture
def encoded(monkeypatch):
    """A fake ``cuTensorMapEncodeTiled`` (its bytes: the address, the layout): the list of
    the addresses it encoded; the kept maps start empty."""
    made: list = []

    def encode(tm, address=None):
        address = tm.array.ptr if address is None else address
        made.append(address)
        layout = (*tm.shape, tm.row_stride, *tm.box, tm.swizzle, tm.dtype.itemsize)
        body = b"".join(n.to_bytes(4, "little") for n in layout)
        return (address.to_bytes(8, "little") + body).ljust(128, b"\0")

    monkeypatch.setattr(tensormap, "_encode", encode)
    monkeypatch.setattr(tensormap, "_KEPT", {})
    return made


def raw(ptr, shape, dtype=f16):
    return RawArray(ptr, shape, dtype, 0)


def test_a_map_is_encoded_once_per_address_and_layout(encoded, fake):  # noqa: F811
    first = kaio.tensor_map_2d(raw(0x10000, (256, 64)), (64, 64))
    again = kaio.tensor_map_2d(raw(0x10000, (256, 64)), (64, 64))
    assert first.encoded() == again.encoded() and encoded == [0x10000]
    strided = fake.array((256, 64), f16, strides=(128, 1))
    others = [
        raw(0x20000, (256, 64)),  # another address
        raw(0x10000, (128, 64)),  # another shape at the same address
        raw(0x10000, (256, 64), bf16),  # another dtype
        fake.array((256, 64), f16),  # a DeviceArray
        strided,  # another row stride
    ]
    maps = [kaio.tensor_map_2d(a, (64, 64)) for a in others]
    maps.append(kaio.tensor_map_2d(raw(0x10000, (256, 64)), (128, 64)))  # another box
    maps.append(kaio.tensor_map_2d(raw(0x10000, (256, 64)), (64, 32), 64))  # and swizzle
    for tm in maps:
        count = len(encoded)
        want = tensormap._encode(tm, tm.address)  # what the driver would make of it
        assert tm.encoded() == want and len(encoded) == count + 2  # new: encoded
    assert len({tm.encoded() for tm in maps}) == len(maps)
    assert strided.ptr.to_bytes(8, "little") == maps[4].encoded()[:8]


def test_kept_maps_are_bounded_and_can_be_turned_off(encoded, monkeypatch):
    monkeypatch.setattr(tensormap, "MAPS_KEPT", 2)
    for ptr in (0x10000, 0x20000, 0x30000, 0x10000):  # the first is dropped by the third
        kaio.tensor_map_2d(raw(ptr, (64, 64)), (64, 64)).encoded()
    assert encoded == [0x10000, 0x20000, 0x30000, 0x10000] and len(tensormap._KEPT) == 2
    monkeypatch.setattr(tensormap, "MAPS_KEPT", 0)
    for _ in range(2):
        kaio.tensor_map_2d(raw(0x30000, (64, 64)), (64, 64)).encoded()
    assert encoded[-2:] == [0x30000, 0x30000]


def test_maps_of_another_encoder_are_not_handed_out(encoded, monkeypatch):
    """Bytes kept from one ``_encode`` (a test's stand-in for the driver) are never given
    for the same key once another one is in place."""
    tm = kaio.tensor_map_2d(raw(0x10000, (64, 64)), (64, 64))
    first = tm.encoded()
    monkeypatch.setattr(tensormap, "_encode", lambda tm, address=None: b"\1" * 128)
    assert kaio.tensor_map_2d(raw(0x10000, (64, 64)), (64, 64)).encoded() == b"\1" * 128
    assert first != b"\1" * 128


def _sm90(monkeypatch):
    gpu = types.SimpleNamespace(arch="sm_90", compute_capability=(9, 0), multiprocessor_count=132)
    monkeypatch.setattr(_arrays, "gpu", lambda like: gpu)
    # the forward's tile counters (kept per stream for good; zeroed through the driver): an
    # output of the fake device instead
    linear = importlib.import_module("kaio_ops.linear")
    monkeypatch.setattr(linear, "_counters", lambda like, n: _arrays.output(like, (n,), i32))


def test_launch_encodes_its_maps_once_per_array(fake, encoded, monkeypatch):  # noqa: F811
    """``_attention_hopper.launch`` (what the bench calls, with no call plan) on the same
    q, k, v again encodes no map; new k and v, two; each launch's parameters hold the maps
    of its own arrays."""
    _sm90(monkeypatch)
    shape = (1, 2, 1024, 64)
    q, k, v = (fake.array(shape, f16) for _ in range(3))
    (qa, ka, va), dims, scale = attention._check_flash("test", q, k, v, None)
    for _ in range(2):
        fake.calls = []
        hopper.launch(qa, ka, va, dims, False, scale)
        assert encoded == [q.ptr, k.ptr, v.ptr] and len(fake.calls) == 1
        assert all(a.ptr.to_bytes(8, "little") in fake.calls[0][5] for a in (q, k, v))
    k2, v2 = fake.array(shape, f16), fake.array(shape, f16)
    (qa, ka, va), dims, scale = attention._check_flash("test", q, k2, v2, None)
    fake.calls = []
    hopper.launch(qa, ka, va, dims, False, scale)
    assert encoded[3:] == [k2.ptr, v2.ptr]
    params = fake.calls[0][5]
    assert k2.ptr.to_bytes(8, "little") in params and k.ptr.to_bytes(8, "little") not in params


def test_flash_attention_on_hopper_replays_its_maps(fake, encoded, monkeypatch):  # noqa: F811
    """flash_attention routed to the Hopper kernel (a fake sm_90): planned and unplanned
    calls launch the same bytes, new arrays get their own maps, and the checks still raise
    once a plan exists."""
    _sm90(monkeypatch)
    shape = (1, 2, 1024, 64)
    plans = _plan.plans_of(kaio_ops.flash_attention)
    for _ in range(2):
        q, k, v = (fake.array(shape, f16) for _ in range(3))
        planned, unplanned, _ = fake.run(kaio_ops.flash_attention, q, k, v)
        assert planned == unplanned and len(planned) == 1
        assert all(a.ptr.to_bytes(8, "little") in planned[0][5] for a in (q, k, v))
    assert len(plans) == 1 and None not in plans.values()
    with pytest.raises(ValueError, match="'v'.*shape"):
        kaio_ops.flash_attention(q, k, fake.array((1, 2, 1000, 64), f16))
    with pytest.raises(ValueError, match="'q'.*f16 or bf16"):
        kaio_ops.flash_attention(fake.array(shape, f32), k, v)


@pytest.mark.parametrize(
    "array, box, swizzle, match",
    [
        (raw(0x10000, (4, 64, 64)), (64, 64), 128, r"f16\[4, 64, 64\]\): needs a 2-D array"),
        (raw(0x10000, (64, 64), kaio.e4m3), (8, 16), 0, "TMA does not copy e4m3"),
        (raw(0x10000, (64, 60)), (64, 8), 0, "rows are 120 bytes apart"),
        (raw(0x10000, (64, 64)), (64, 64), 96, "swizzle must be one of"),
        (raw(0x10000, (64, 64)), (300, 64), 128, "each box side must be 1..256"),
        (raw(0x10000, (64, 64)), (64, 128), 128, "a box row is 256 bytes"),
    ],
)
def test_map_checks_still_raise(array, box, swizzle, match):
    """The checks of ``kaio.tensor_map_2d`` (arrays given by address included) name the
    array and what is wrong."""
    with pytest.raises(ValueError, match=match):
        kaio.tensor_map_2d(array, box, swizzle)
