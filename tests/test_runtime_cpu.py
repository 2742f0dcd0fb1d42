"""Runtime logic that needs no GPU: cache, argument description and validation, DLPack
metadata, launch-config parsing, PTX version checks, error formatting, parameter packing."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import struct
import sys
import types

import numpy as np
import pytest

import kaio
from kaio import f16, f32, i32, u32
from kaio.errors import CudaError, LaunchError
from kaio.kernel import parse_launch_config
from kaio.runtime import dlpack, driver
from kaio.runtime.arginfo import ArgInfo, RawArray, c_strides
from kaio.runtime.arguments import NUMPY_HINT, check_array, check_scalar, describe
from kaio.runtime.cache import DiskCache, cache_dir, cache_key, cached
from kaio.runtime.device import current
from kaio.runtime.launcher import (
    bf16_bits,
    build_launcher,
    launch_abi,
    merge_entries,
    param_format,
)


@kaio.gpu_kernel(block_size=256)
def add(x: f32[:], y: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        out[i] = x[i] + y[i]


# ----------------------------------------------------------------------------- cache
def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KAIO_CACHE_DIR", str(tmp_path / "k"))
    assert cache_dir() == str(tmp_path / "k")
    monkeypatch.delenv("KAIO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == str(tmp_path / "xdg" / "kaio")


def test_cache_key_depends_on_spec_arch_and_driver():
    base = cache_key("abc", "sm_90", 12080)
    assert base == cache_key("abc", "sm_90", 12080)
    assert len({base, cache_key("abd", "sm_90", 12080), cache_key("abc", "sm_80", 12080)}) == 3
    assert base != cache_key("abc", "sm_90", 12090)
    assert base != cache_key("abc", "sm_90", 12080, "Build cuda_13.0.r13.0/compiler.1_0")


@pytest.fixture
def fresh_compiler(monkeypatch):
    """``KAIO_PTXAS`` is read once a process: each test reads it again."""
    from kaio.runtime import module

    monkeypatch.setattr(module, "_compiler", None)
    return module


def test_the_driver_jit_builds_kernels_unless_kaio_ptxas_says(fresh_compiler, monkeypatch):
    """By default the module image is the PTX itself (NUL-terminated), which the driver
    compiles as a whole program when it loads; never a cubin from its linker."""
    monkeypatch.delenv("KAIO_PTXAS", raising=False)
    assert fresh_compiler.compiler() == ("", "")
    monkeypatch.setenv("KAIO_PTXAS", "0")
    monkeypatch.setattr(fresh_compiler, "_compiler", None)
    assert fresh_compiler.compiler() == ("", "")
    ptx = add.ptx("sm_80")
    image = fresh_compiler.build_image(ptx, "add", "sm_80", types.SimpleNamespace(arch="sm_90"))
    assert image == ptx.encode() + b"\0" and not fresh_compiler.is_cubin(image)


def test_kaio_ptxas_naming_no_executable_says_what_to_do(fresh_compiler, monkeypatch, tmp_path):
    monkeypatch.setenv("KAIO_PTXAS", str(tmp_path / "ptxas"))
    with pytest.raises(LaunchError, match="KAIO_PTXAS=.*no ptxas executable at .*unset"):
        fresh_compiler.compiler()


def test_kaio_ptxas_auto_builds_a_cubin_for_the_ptx_target(fresh_compiler, monkeypatch):
    from kaio.ptx.ptxas import find_ptxas

    if find_ptxas() is None:
        pytest.skip("no ptxas (pip install nvidia-cuda-nvcc)")
    monkeypatch.setenv("KAIO_PTXAS", "auto")
    path, build = fresh_compiler.compiler()
    assert path == find_ptxas() and build.startswith("Build cuda_")
    # SASS is for the device's architecture, whatever older target the PTX names
    for ptx in (add.ptx("sm_80"), add.ptx("sm_90")):
        cubin = fresh_compiler.build_image(ptx, "add", "sm_80", types.SimpleNamespace(arch="sm_90"))
        assert fresh_compiler.is_cubin(cubin) and _elf_sm(cubin) == 90
    sm80 = types.SimpleNamespace(arch="sm_80")
    assert _elf_sm(fresh_compiler.build_image(add.ptx("sm_80"), "add", "sm_80", sm80)) == 80
    broken = add.ptx("sm_80").replace("ret;", "bogus;")
    with pytest.raises(LaunchError, match="compiling kernel broken with KAIO_PTXAS: .*ptxas"):
        fresh_compiler.build_image(broken, "broken", "sm_80", sm80)


def _elf_sm(cubin: bytes) -> int:
    """The SM number a cubin is for: bits 8-15 of its ELF header's e_flags (CUDA ELF)."""
    return struct.unpack_from("<I", cubin, 48)[0] >> 8 & 0xFF


def test_cache_round_trip_leaves_no_temporary_files(tmp_path):
    cache = DiskCache(str(tmp_path))
    assert cache.get("k") is None
    cache.put("k", b"\x7fELF cubin bytes")
    assert cache.get("k") == b"\x7fELF cubin bytes"
    assert os.listdir(tmp_path) == ["k.cubin"]


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) - 3],  # a partial write
        lambda data: data[:-1] + bytes([data[-1] ^ 1]),  # a flipped bit
        lambda data: b"garbage",  # not an entry at all
        lambda data: b"",  # empty file
    ],
)
def test_corrupt_entry_is_discarded_and_rebuilt(tmp_path, damage):
    cache = DiskCache(str(tmp_path))
    builds = []

    def build() -> bytes:
        builds.append(1)
        return b"fresh cubin"

    assert cached(cache, "k", build) == (b"fresh cubin", False)
    path = cache.path("k")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(damage(data))
    assert cache.get("k") is None
    assert not os.path.exists(path)  # the damaged entry is gone
    assert cached(cache, "k", build) == (b"fresh cubin", False)
    assert cached(cache, "k", build) == (b"fresh cubin", True)
    assert len(builds) == 2


def test_cache_entries_hold_the_cubin_and_what_a_launch_needs():
    from kaio.runtime.module import pack_entry, unpack_entry

    spec = add.specialize({}, ("C", "C", "A"))
    meta = {
        "name": "add",
        "reqntid": [256, 1, 1],
        "maxntid": None,
        "params": [
            [p.name, p.role, p.source, p.dim, p.value.type.name] for p in spec.function.params
        ],
    }
    cubin = bytes(np.random.default_rng(2).integers(0, 256, 999, dtype=np.uint8))
    entry = pack_entry(meta, cubin)
    assert unpack_entry(entry) == (meta, cubin)
    assert unpack_entry(None) is None
    assert unpack_entry(cubin) is None  # a bare cubin, as an older kaio cached: rebuilt
    assert unpack_entry(entry[:20]) is None  # torn inside the metadata
    assert unpack_entry(pack_entry({"name": "add"}, cubin)) is None  # fields missing


def test_cache_entries_name_their_variant():
    from kaio.runtime.module import variant

    @kaio.gpu_kernel
    def scaled(out: f32[:], OP: kaio.constexpr, VEC: kaio.constexpr):
        out[0] = 1.0

    spec = scaled.specialize({"OP": "softmax", "VEC": 8}, ("C",))
    assert variant(spec, "sm_90") == "sm_90 backend=ptx OP=softmax VEC=8"


def test_kaio_cubins_writes_the_cached_cubins(tmp_path, capsys):
    """`kaio cubins NAME --out DIR`: each cached cubin of a kernel of that name as
    NAME-KEY.cubin, the bytes the cache holds; PTX entries (the driver's JIT), damaged and
    older-format entries skipped; none found is an error that names the cache and
    KAIO_PTXAS."""
    from kaio.cli import main
    from kaio.runtime.module import pack_entry

    cache_path = tmp_path / "cache"
    cache = DiskCache(str(cache_path))
    rng = np.random.default_rng(5)
    blobs = {}
    for name, key in (("add", "a" * 64), ("scale", "b" * 64), ("add", "c" * 64)):
        blobs[name, key] = b"\x7fELF" + bytes(rng.integers(0, 256, 300, dtype=np.uint8))
        meta = {"name": name, "reqntid": None, "maxntid": None, "params": [], "variant": key[0]}
        cache.put(key, pack_entry(meta, blobs[name, key]))
    ptx_meta = {"name": "add", "reqntid": None, "maxntid": None, "params": [], "variant": "f"}
    cache.put("f" * 64, pack_entry(ptx_meta, add.ptx("sm_80").encode() + b"\0"))
    cache.put("d" * 64, b"a bare cubin, as an older kaio cached")
    (cache_path / ("e" * 64 + ".cubin")).write_bytes(b"torn")
    out = tmp_path / "out"
    args = ["--cache", str(cache_path), "--out", str(out)]
    assert main(["cubins", "add", *args]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        f"add-{'a' * 12}.cubin",
        f"add-{'c' * 12}.cubin",
    ]
    for key in ("a" * 64, "c" * 64):
        assert (out / f"add-{key[:12]}.cubin").read_bytes() == blobs["add", key]
    listing = capsys.readouterr().out.splitlines()
    assert [line.split()[-1] for line in listing] == ["a", "c"]  # each entry's variant
    assert main(["cubins", *args]) == 0  # every kernel
    assert len(list(out.iterdir())) == 3
    capsys.readouterr()
    assert main(["cubins", "missing", *args]) == 1
    error = capsys.readouterr().err
    assert f"no cubins of kernels named missing in the cache at {cache_path}" in error
    assert "KAIO_PTXAS=auto" in error


def test_unwritable_cache_warns_once_and_never_raises(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = DiskCache(str(blocker / "sub"))
    with pytest.warns(UserWarning, match="KAIO_CACHE_DIR"):
        cache.put("k", b"x")
    cache.put("k", b"x")  # no second warning, no exception
    assert cache.get("k") is None


# ----------------------------------------------------------------------------- arguments
class FakeCAI:
    def __init__(self, shape, typestr, strides=None, ptr=0x1000):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
        }


@pytest.fixture
def no_driver_pointer_query(monkeypatch):
    monkeypatch.setattr("kaio.runtime.arguments._pointer_device", lambda ptr: 0)


def test_describe_cuda_array_interface(no_driver_pointer_query):
    info = describe(FakeCAI((4, 6), "<f4"))
    assert (info.ptr, info.shape, info.strides, info.dtype) == (0x1000, (4, 6), (6, 1), f32)
    assert info.contiguous and info.layout == "C"
    strided = describe(FakeCAI((4, 3), "<f2", strides=(12, 4)))
    assert strided.strides == (6, 2) and strided.dtype == f16 and strided.layout == "A"


def test_describe_torch_like_tensor():
    class Device:
        type = "cuda"

    class Tensor:
        is_cuda = True
        dtype = "torch.bfloat16"
        shape = (3, 5)
        device = Device()

        def data_ptr(self):
            return 0xABC0

        def stride(self):
            return (1, 3)

        def is_contiguous(self):
            return False

        def get_device(self):
            return 1

    Tensor.__module__ = "torch"
    info = describe(Tensor())
    assert (info.ptr, info.shape, info.strides, info.dtype.name, info.device) == (
        0xABC0,
        (3, 5),
        (1, 3),
        "bf16",
        1,
    )
    assert info.layout == "A"
    Tensor.is_cuda = False
    Tensor.device = "cpu"
    with pytest.raises(LaunchError, match=r"\.cuda\(\)"):
        describe(Tensor())


def test_numpy_argument_names_both_ways_out():
    with pytest.raises(LaunchError) as e:
        describe(np.zeros(4, np.float32))
    assert "kaio.to_device" in str(e.value) and "kaio.simulate()" in str(e.value)
    assert "kaio.to_device" in NUMPY_HINT


def test_check_array_names_parameter_and_expected_type(no_driver_pointer_query):
    with pytest.raises(LaunchError, match=r"'x' \(expects f32\[:\]\).*array of f16"):
        check_array(FakeCAI((4,), "<f2"), "x", f32[:], "k")
    with pytest.raises(LaunchError, match=r"'x' \(expects f32\[:\]\).*2-d array"):
        check_array(FakeCAI((4, 4), "<f4"), "x", f32[:], "k")
    with pytest.raises(LaunchError, match=r"'x'.*to_device"):
        check_array(np.zeros(4, np.float32), "x", f32[:], "k")
    with pytest.raises(LaunchError, match=r"'x'.*not a CUDA array"):
        check_array([1.0, 2.0], "x", f32[:], "k")


def test_launch_refuses_arrays_on_two_gpus():
    """A kernel runs on the GPU its arrays are on, so they must all be on one (checked before
    any GPU is touched)."""
    from kaio.runtime.launch import _device

    class Kernel:
        __name__ = "k"

    arrays = [
        (ArgInfo(0x10, (4,), (1,), f32, 0), "x", f32[:]),
        (ArgInfo(0x20, (4,), (1,), f32, 0), "y", f32[:]),
        (ArgInfo(0x30, (4,), (1,), f32, 1), "out", f32[:]),
    ]
    with pytest.raises(LaunchError, match=r"k: argument 'out' .* on GPU 1 but 'x' is on GPU 0"):
        _device(Kernel(), arrays)


def test_check_scalar_ranges_and_kinds():
    check_scalar(7, "n", u32, "k")
    check_scalar(np.uint32(7), "n", u32, "k")
    check_scalar(3, "s", f32, "k")
    with pytest.raises(LaunchError, match=r"'n' \(expects u32\): -1 is out of range"):
        check_scalar(-1, "n", u32, "k")
    with pytest.raises(LaunchError, match=r"out of range"):
        check_scalar(2**31, "n", i32, "k")
    with pytest.raises(LaunchError, match=r"got float 2.5; pass int"):
        check_scalar(2.5, "n", i32, "k")
    with pytest.raises(LaunchError, match="scalar"):
        check_scalar(np.zeros(3), "n", f32, "k")


def test_arginfo_signature_is_interned_and_abi_entries():
    a = ArgInfo(0x100, (2, 3), (3, 1), f32, 0)
    b = ArgInfo(0x200, (5, 7), (7, 1), f32, 0)
    assert a.sig is b.sig
    assert struct.unpack("=Qqq", a.abi_c) == (0x100, 2, 3)
    assert struct.unpack("=Qqqqq", a.abi_a) == (0x100, 2, 3, 3, 1)
    assert c_strides((2, 3, 4)) == (12, 4, 1)
    assert ArgInfo(0, (4, 1), (1, 9), f32, 0).contiguous  # size-1 dims have any stride


def test_raw_array_describes_as_contiguous():
    raw = RawArray(0x400, (3, 5), f32, 1, owner="keep")
    info = describe(raw)
    assert (info.ptr, info.shape, info.strides, info.dtype, info.device) == (
        0x400,
        (3, 5),
        (5, 1),
        f32,
        1,
    )
    assert info.contiguous and raw.owner == "keep"
    with pytest.raises(LaunchError, match="convert it to f16"):
        check_array(raw, "x", kaio.f16[:, :], "k")


# ----------------------------------------------------------------------------- DLPack
def test_dlpack_dtype_codes():
    assert dlpack.dl_dtype(kaio.bf16) == (4, 16)
    assert dlpack.dl_dtype(f32) == (2, 32)
    assert dlpack.dl_dtype(kaio.u8) == (1, 8)
    assert dlpack.dl_dtype(kaio.i64) == (0, 64)
    assert dlpack.from_dl_dtype(4, 16) == kaio.bf16
    with pytest.raises(TypeError):
        dlpack.from_dl_dtype(2, 32, lanes=4)


def test_dlpack_export_round_trip_and_release():
    owner = object()
    before = len(dlpack._live)
    capsule = dlpack.export(owner, 0xDEAD00, (2, 3), (1, 2), kaio.bf16, 1)
    assert len(dlpack._live) == before + 1
    ptr, shape, strides, dtype, device = dlpack.read_capsule(capsule)
    assert (ptr, shape, strides, dtype, device) == (0xDEAD00, (2, 3), (1, 2), kaio.bf16, (2, 1))
    del capsule  # never consumed: the capsule destructor releases the tensor
    assert len(dlpack._live) == before


def test_dlpack_consumer_deleter_releases():
    capsule = dlpack.export(None, 0x1000, (4,), (1,), f32, 0)
    api = ctypes.pythonapi
    address = api.PyCapsule_GetPointer(id(capsule), b"dltensor")
    api.PyCapsule_SetName.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    api.PyCapsule_SetName(id(capsule), b"used_dltensor")  # what a consumer does
    managed = dlpack.DLManagedTensor.from_address(address)
    del capsule
    assert address in dlpack._live  # consumed: the consumer owns it now
    managed.deleter(ctypes.pointer(managed))
    assert address not in dlpack._live


def test_describe_dlpack_producer():
    class Producer:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, stream=None):
            return dlpack.export(self, 0x5000, (8,), (1,), f32, 0)

    info = describe(Producer())
    assert (info.ptr, info.shape, info.dtype, info.device) == (0x5000, (8,), f32, 0)

    class HostProducer(Producer):
        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(LaunchError, match="not CUDA"):
        describe(HostProducer())


# ----------------------------------------------------------------------------- launch config
def test_parse_launch_config_forms():
    cfg = parse_launch_config(10, 256)
    assert cfg.grid == (10, 1, 1) and cfg.block == (256, 1, 1) and cfg.shared_bytes == 0
    cfg = parse_launch_config(((4, 2), (16, 16), None, 1024), None)
    assert cfg.grid == (4, 2, 1) and cfg.block == (16, 16, 1) and cfg.shared_bytes == 1024
    with pytest.raises(LaunchError, match="no block size"):
        parse_launch_config(10, None)
    with pytest.raises(LaunchError, match=">= 1"):
        parse_launch_config((0, 32), None)


def test_launch_routes_to_simulator_when_active(monkeypatch):
    calls = []
    fake = types.ModuleType("kaio.sim.launcher")
    fake.run_simulated = lambda kernel, config, args, kwargs: calls.append((kernel, args, kwargs))
    monkeypatch.setitem(sys.modules, "kaio.sim.launcher", fake)
    monkeypatch.setattr(current, "simulating", 1)
    x = np.zeros(4, np.float32)
    add[1, 256](x, x, x, n=4)
    assert calls == [(add, (x, x, x), {"n": 4})]


def test_numpy_launch_outside_simulator_is_refused_before_any_driver_call(monkeypatch):
    monkeypatch.setattr(current, "simulating", 0)
    x = np.zeros(4, np.float32)
    with pytest.raises(LaunchError, match=r"add: argument 'x'.*kaio.to_device.*kaio.simulate"):
        add[1, 256](x, x, x, 4)
    with pytest.raises(LaunchError, match="add"):
        add[1, 256](x, x)


# ----------------------------------------------------------------------------- packing
def test_param_format_aligns_every_entry():
    def param(type_):
        return types.SimpleNamespace(role="scalar", value=types.SimpleNamespace(type=type_))

    fmt, size = param_format([param(kaio.u8), param(kaio.u64), param(u32), param(kaio.f16)])
    assert fmt == "=B" + "x" * 7 + "QIe"
    assert struct.calcsize(fmt) == size == 22
    assert param_format([])[1] == 0


def test_launch_abi_follows_layouts():
    spec = add.specialize({}, ("C", "C", "A"))
    assert launch_abi(add, spec.layouts, spec.function.params) == [
        (0, "C"),
        (1, "C"),
        (2, "A"),
        (3, "u32"),
    ]
    fmt, size = param_format(spec.function.params)
    assert fmt == "=QqQqQqqI" and size == 60


def test_merge_entries_packs_an_arrays_entries_as_one_bytes_entry():
    fmt = "=IxxxxQqqQqI"  # u32, padding, a 2-D array (ptr, 2 shapes), a 1-D array, u32
    assert merge_entries(fmt, {1: 3}) == "=Ixxxx24sQqI"
    assert merge_entries(fmt, {1: 3, 4: 2}) == "=Ixxxx24s16sI"
    assert struct.calcsize(merge_entries(fmt, {1: 3, 4: 2})) == struct.calcsize(fmt)
    assert merge_entries(fmt, {}) == fmt
    with pytest.raises(ValueError, match="padding"):
        merge_entries("=QIxxxxq", {0: 3})
    info = ArgInfo(0xABC0, (5, 7), (7, 1), f32, 0)
    buf = bytearray(struct.calcsize(fmt))
    struct.pack_into(merge_entries(fmt, {1: 3}), buf, 0, 9, info.abi_c, 0x100, 3, 4)
    assert struct.unpack(fmt, buf) == (9, 0xABC0, 5, 7, 0x100, 3, 4)


def test_bf16_bits():
    assert bf16_bits(1.0) == 0x3F80
    assert bf16_bits(-2.0) == 0xC000


# ----------------------------------------------------------------------------- driver
def test_max_ptx_isa_per_driver():
    assert driver.max_ptx_isa(12000) == (8, 0)
    assert driver.max_ptx_isa(12060) == (8, 5)
    assert driver.max_ptx_isa(12070) == (8, 6)
    assert driver.max_ptx_isa(12080) == (8, 7)
    assert driver.max_ptx_isa(12090) == (8, 8)
    assert driver.max_ptx_isa(13000) == (9, 0)


def test_ptx_version_check_names_the_driver_needed():
    ptx = "//\n.version 8.7\n.target sm_90\n.address_size 64\n"
    assert driver.ptx_isa_of(ptx) == (8, 7)
    driver.check_ptx_supported(ptx, 12080)
    with pytest.raises(CudaError) as e:
        driver.check_ptx_supported(ptx, 12060, "gemm")
    message = str(e.value)
    assert "gemm" in message and "CUDA 12.8 or newer" in message and "CUDA 12.6" in message
    assert "up to 8.5" in message
    assert e.value.name == "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"
    driver.check_ptx_supported(".version 9.9\n", 12080)  # unknown to kaio: the driver decides
    with pytest.raises(ValueError):
        driver.ptx_isa_of(".target sm_90\n")


def test_error_name_and_text_formatting(monkeypatch):
    monkeypatch.setattr(driver, "last_launched", {0: ["attention"], 7: ["softmax"], 9: [None]})
    error = driver.cuda_error(700, "synchronize", stream=7)
    assert isinstance(error, CudaError)
    assert error.name == "CUDA_ERROR_ILLEGAL_ADDRESS" and error.code == 700
    assert str(error).startswith("synchronize: CUDA_ERROR_ILLEGAL_ADDRESS")
    assert "last kernel launched on this stream: softmax" in str(error)
    assert "attention, softmax" in str(driver.cuda_error(700, "synchronize"))
    plain = driver.cuda_error(1, "cuMemAlloc")
    assert plain.name == "CUDA_ERROR_INVALID_VALUE" and "kernel" not in str(plain)
    with pytest.raises(CudaError, match="CUDA_ERROR_OUT_OF_MEMORY"):
        driver.check((driver.cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None), "cuMemAlloc")
    assert driver.check((driver.cu.CUresult.CUDA_SUCCESS, 5)) == 5
    assert driver.check((driver.cu.CUresult.CUDA_SUCCESS,)) is None


def test_info_never_raises():
    text = kaio.runtime.info()
    assert "CUDA driver" in text and "kernel cache" in text


# ----------------------------------------------------------------------------- launcher
@pytest.fixture
def fake_driver(monkeypatch):
    """A fake ``cuLaunchKernelEx`` that records (function, grid, block, shared, stream,
    parameter bytes, the parameters' offsets in them), and a fake loaded kernel on a fake
    GPU 0; yields (calls, loaded)."""
    from kaio.runtime import launcher as launcher_mod

    calls = []

    def fake_launch(config, func, params, extra):
        cfg = config._obj  # the ctypes object behind byref()
        assert extra is None
        # the function handle; kernelParams: where each parameter sits in one buffer
        handle, pointers = launcher_mod.argument_values(func, params)
        calls.append(
            (
                handle,
                tuple(cfg.grid),
                tuple(cfg.block),
                cfg.shared,
                cfg.stream or 0,
                ctypes.string_at(pointers[0], 64),
                [p - pointers[0] for p in pointers],
            )
        )
        return 0

    def fake_elsewhere(device):
        def elsewhere(config, func, params):  # the launch with device's context made current
            calls.append(("context", device.ordinal))
            return fake_launch(config, func, params, None)

        return elsewhere

    monkeypatch.setattr(launcher_mod, "raw_launch_kernel", lambda: fake_launch)
    monkeypatch.setattr(launcher_mod, "launcher_elsewhere", fake_elsewhere)
    monkeypatch.setattr(launcher_mod, "visiting", contextlib.nullcontext)
    device = types.SimpleNamespace(
        ordinal=0,
        context=0xC0,
        max_block_dim=(1024, 1024, 64),
        max_threads_per_block=1024,
        max_grid_dim=(2**31 - 1, 65535, 65535),
        name="fake",
        arch="sm_90",
    )
    loaded = types.SimpleNamespace(
        handle=0xF00,
        device=device,
        name="add",
        reqntid=None,
        maxntid=None,
        cluster=None,
        pdl=False,
        attribute=lambda name: 1024,
        allow_dynamic_shared=lambda n: None,
        debug=None,
    )
    yield calls, loaded


def fake_device_array(device, ptr, shape, strides):
    from kaio.runtime.memory import DeviceArray

    a = DeviceArray.__new__(DeviceArray)
    a._init(types.SimpleNamespace(ptr=ptr, device=device), ptr, shape, strides, np.dtype("f4"), f32)
    return a


def build(kernel, spec, loaded, args):
    """A launcher built the way the slow path builds one (infos from ``describe``)."""
    from kaio.runtime.launcher import build_launcher

    infos = {k: describe(a) for k, a in enumerate(args) if not isinstance(a, int | float)}
    loaded.params = spec.function.params  # what load() reads from the compiled kernel
    return build_launcher(kernel, spec, loaded, args, infos)


GRID, BLOCK = (2, 1, 1), (256, 1, 1)


def test_generated_launcher_packs_and_rechecks_signature(fake_driver):
    """The fast launcher, driven against a fake libcuda: the parameter buffer holds the ABI
    entries, and a different signature falls back (returns False) instead of launching."""
    calls, loaded = fake_driver
    dev = loaded.device
    x, y = fake_device_array(dev, 0x1000, (8,), (4,)), fake_device_array(dev, 0x2000, (8,), (4,))
    out = fake_device_array(dev, 0x3000, (16,), (8,))
    args = (x, y, out, 8)
    launch = build(add, add.specialize({}, ("C", "C", "A")), loaded, args)(GRID, BLOCK, 0, 0x77)
    assert launch(args)
    func, grid, block, shared, stream, buf, offsets = calls[-1]
    assert (func, grid, block, shared, stream) == (0xF00, GRID, BLOCK, 0, 0x77)
    assert offsets == [0, 8, 16, 24, 32, 40, 48, 56]
    assert struct.unpack("=QqQqQqqI", buf[:60]) == (0x1000, 8, 0x2000, 8, 0x3000, 16, 2, 8)
    assert not launch((x, y, x, 8))  # contiguous out: another specialization
    assert not launch((x, y, out, -1))  # u32 cannot hold -1
    assert not launch((x, y, out, 2.5))  # nor a float
    assert not launch((x, y, out))
    assert len(calls) == 1


def test_generated_launcher_runs_on_the_arrays_gpu(fake_driver, monkeypatch):
    """Arrays on a GPU other than the current device: the launch makes their GPU's context
    current for the driver call (``elsewhere``), with no switch when they are on the current
    one; a kernel without arrays launches only on the current device."""
    from kaio.runtime.device import current

    calls, loaded = fake_driver
    dev = loaded.device  # GPU 0
    x, y, out = (fake_device_array(dev, p, (8,), (4,)) for p in (0x1000, 0x2000, 0x3000))
    args = (x, y, out, 8)
    launch = build(add, add.specialize({}, ("C", "C", "C")), loaded, args)(GRID, BLOCK, 0, 0)
    assert launch(args)
    assert [c[0] for c in calls] == [0xF00]
    monkeypatch.setattr(current, "ordinal", 1)
    assert launch(args)
    assert [c[0] for c in calls[1:]] == ["context", 0xF00] and calls[1] == ("context", 0)

    @kaio.gpu_kernel
    def count(n: u32, out: u32):
        i = u32(0)
        while i < n:
            i += out

    spin = build(count, count.specialize({}, ()), loaded, (5, 1))(GRID, BLOCK, 0, 0)
    assert not spin((5, 1))  # loaded on GPU 0, and GPU 1 is current
    monkeypatch.setattr(current, "ordinal", 0)
    assert spin((5, 1))
    assert calls[-1][0] == 0xF00 and len(calls) == 4


class Tensor:
    """Enough of a torch tensor for the launcher (its module is made to read "torch")."""

    is_cuda = True

    def __init__(self, ptr, shape, strides, dtype="torch.float32", device=0):
        self.ptr, self.shape, self.strides, self.dtype, self.device = (
            ptr,
            shape,
            strides,
            dtype,
            device,
        )

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return self.strides

    def is_contiguous(self):
        return self.strides == c_strides(self.shape)

    def get_device(self):
        return self.device


Tensor.__module__ = "torch"


class CupyArray:
    """Enough of a CuPy array for the launcher and ``describe`` (module made to read "cupy")."""

    def __init__(self, ptr, shape, dtype="f4", device=0):
        self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)
        self.data = types.SimpleNamespace(ptr=ptr, device_id=device)
        self.flags = types.SimpleNamespace(c_contiguous=True)
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": self.dtype.str,
            "data": (ptr, False),
            "strides": None,
            "version": 3,
        }


CupyArray.__module__ = "cupy"


def test_torch_and_cupy_fast_paths_check_dtype_rank_layout_device(
    fake_driver, no_driver_pointer_query
):
    """Torch tensors and CuPy arrays are read through their own attributes; a dtype, rank,
    contiguity or device other than the launcher's makes it refuse (no launch)."""
    calls, loaded = fake_driver
    x = Tensor(0x1000, (8,), (1,))
    y = CupyArray(0x2000, (8,))
    out = Tensor(0x3000, (16,), (2,))
    args = (x, y, out, 8)
    launch = build(add, add.specialize({}, ("C", "C", "A")), loaded, args)(GRID, BLOCK, 0, 0)
    assert launch(args)
    assert struct.unpack("=QqQqQqqI", calls[-1][5][:60]) == (0x1000, 8, 0x2000, 8, 0x3000, 16, 2, 8)
    n = len(calls)
    refused = [
        (Tensor(0x1000, (8,), (1,), dtype="torch.float16"), y, out, 8),
        (Tensor(0x1000, (8,), (1,), device=1), y, out, 8),
        (Tensor(0x1000, (8,), (1,), device=-1), y, out, 8),  # a CPU tensor
        (Tensor(0x1000, (2, 4), (4, 1)), y, out, 8),
        (Tensor(0x1000, (8,), (2,)), y, out, 8),  # strided where the kernel wants 'C'
        (x, y, Tensor(0x3000, (16,), (1,)), 8),  # contiguous where the launcher has 'A'
        (x, CupyArray(0x2000, (8,), dtype="f2"), out, 8),
        (x, CupyArray(0x2000, (8,), device=1), out, 8),
        (x, CupyArray(0x2000, (2, 4)), out, 8),
        (x, fake_device_array(loaded.device, 0x2000, (8,), (4,)), out, 8),  # another type
    ]
    for bad in refused:
        assert not launch(bad)
    assert len(calls) == n
    strided = CupyArray(0x2000, (8,))
    strided.flags.c_contiguous = False
    assert not launch((x, strided, out, 8))
    assert launch((Tensor(0x5000, (3,), (1,)), CupyArray(0x6000, (3,)), out, 3))
    assert struct.unpack("=QqQq", calls[-1][5][:32]) == (0x5000, 3, 0x6000, 3)


def test_torch_dtypes_are_cached_per_dtype_object():
    from kaio.runtime.arguments import torch_dtype

    assert torch_dtype("torch.bfloat16") is kaio.bf16
    assert torch_dtype("torch.complex64") is None


def test_launch_binds_each_launcher_once_per_configuration(monkeypatch):
    """A ``Launch`` binds the kernel's launchers to its configuration once, tries them most
    recent first, and follows the kernel's list (new launchers, dropped ones)."""
    from kaio.kernel import parse_launch_config
    from kaio.runtime.launch import _DISPATCH, Launch

    bound = []

    def launcher(name, accepts):
        def bind(grid, block, shared, stream):
            bound.append((name, grid, block, shared, stream))
            return lambda args: accepts(args)

        return bind

    ints = launcher("ints", lambda args: isinstance(args[0], int))
    strs = launcher("strs", lambda args: isinstance(args[0], str))
    kernel = types.SimpleNamespace(__name__="k", _launchers={_DISPATCH: [ints]})
    launch = Launch(kernel, parse_launch_config((4, 32), None))
    launch(1)
    launch(2)
    assert bound == [("ints", (4, 1, 1), (32, 1, 1), 0, 0)]
    kernel._launchers[_DISPATCH].insert(0, strs)  # built by another configuration
    launch("a")
    launch(3)
    assert [b[0] for b in bound] == ["ints", "strs"]
    assert len(launch._bound) == 2
    kernel._launchers[_DISPATCH].remove(ints)  # dropped from the kernel's list
    launch("b")
    assert len(launch._bound) == 2  # unchanged until a call misses
    floats = launcher("floats", lambda args: isinstance(args[0], float))

    def build(kernel_, args):
        kernel_._launchers[_DISPATCH].insert(0, floats)
        return floats

    monkeypatch.setattr("kaio.runtime.launch._build", build)
    launch(0.5)  # no bound launcher takes it: the slow path builds one
    assert list(launch._bindings) == [floats, strs]
    assert [b[0] for b in bound] == ["ints", "strs", "floats"]
    launch(1.5)
    assert len(bound) == 3


def native_call(name: str):
    """libc's ``name`` called through ``kaio.runtime.native``'s builtin (the test skipped
    where there is none)."""
    from kaio.runtime import native

    address = ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value
    call = native.trampoline(address, name)
    if call is None:
        pytest.skip(f"no native call here: {native.status()}")
    return call


@pytest.mark.parametrize("through", ["ctypes", "native"])
def test_pointer_argument_passes_its_address_through(through):
    """``pointer_argument(address)`` reaches a C function as ``address`` itself (a call with
    no argtypes, like the launches', or kaio.runtime.native's builtin), and reads back with
    ``argument_values``; the ``kernelParams`` argument of a parameter slot is the array of
    pointers into its buffer."""
    from kaio.runtime.launcher import argument_values, parameter_slot, pointer_argument

    if through == "ctypes":
        memcmp = ctypes.PYFUNCTYPE(ctypes.c_int)(("memcmp", ctypes.CDLL(None)))
    else:
        call = native_call("memcmp")

        def memcmp(a, b, n):  # the builtin takes 4 arguments, pointers: n as one
            return call(a, b, pointer_argument(n.value), None)

    a = ctypes.create_string_buffer(b"kaio launch 1234")
    b = ctypes.create_string_buffer(b"kaio launch 1234")
    c = ctypes.create_string_buffer(b"kaio launch 9999")
    n = ctypes.c_size_t(16)
    for address, expected in ((ctypes.addressof(b), 0), (ctypes.addressof(c), -1)):
        got = memcmp(ctypes.byref(a), pointer_argument(address), n)
        assert (got > 0) - (got < 0) == expected
    buf, params = parameter_slot(12, [0, 8])
    handle, pointers = argument_values(pointer_argument(0x7F12_3456_7000), params)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert handle == 0x7F12_3456_7000 and pointers == [base, base + 8]
    assert parameter_slot(0, [])[1] is None


def test_native_call_refuses_what_ctypes_would_not_pass_as_a_pointer(tmp_path, monkeypatch):
    """The builtin passes None as NULL and refuses other arguments than ``byref``s and None,
    and another count, with a TypeError; a process that finds its code in the disk cache
    compiles nothing."""
    from kaio.runtime import module, native
    from kaio.runtime.launcher import pointer_argument

    memcmp = native_call("memcmp")
    a, b = ctypes.create_string_buffer(b"abc"), ctypes.create_string_buffer(b"abd")
    assert memcmp(ctypes.byref(a), ctypes.byref(b), None, None) == 0  # n = NULL: 0 bytes
    assert memcmp(ctypes.byref(a), ctypes.byref(b), pointer_argument(3), None) < 0
    for wrong in ((a, b, None, None), (0, 1, None, None), (None,) * 3, (None,) * 5):
        with pytest.raises(TypeError):
            memcmp(*wrong)
    monkeypatch.setattr(module, "_disk_cache", DiskCache(str(tmp_path)))
    ir = native._ir(*native._layout())
    first = native._load(ir)  # compiled, then cached
    monkeypatch.setattr(native, "_compile", lambda ir: pytest.fail("compiled again"))
    again = native._load(ir)
    assert ctypes.string_at(first, 16) == ctypes.string_at(again, 16) and first != again


def test_launches_on_gpu_0_know_they_are_home_until_a_thread_moves(fake_driver):
    """While no thread has made a device other than 0 current (``device.moved``), a launch
    on GPU 0 does not read the thread-local current device; once one has (through
    ``current.ordinal``), it does, and launches from a thread on GPU 1 switch context."""
    from kaio.runtime import device as device_mod
    from kaio.runtime.device import current

    calls, loaded = fake_driver
    saved, device_mod.moved[0] = device_mod.moved[0], False
    saved_ordinal = current._ordinal
    try:
        dev = loaded.device  # GPU 0
        x, y, out = (fake_device_array(dev, p, (8,), (4,)) for p in (0x1000, 0x2000, 0x3000))
        args = (x, y, out, 8)
        launch = build(add, add.specialize({}, ("C", "C", "C")), loaded, args)(GRID, BLOCK, 0, 0)
        current._ordinal = 1  # not through the setter: not read
        assert launch(args) and [c[0] for c in calls] == [0xF00]
        current.ordinal = 1  # the setter: a thread moved
        assert device_mod.moved[0]
        assert launch(args) and calls[1] == ("context", 0)
        current.ordinal = 0
        assert launch(args) and calls[3][0] == 0xF00 and len(calls) == 4
    finally:
        # both as they were: a ``moved`` left set would send later tests' launches
        # on a real GPU 0 down the other-device path
        current._ordinal, device_mod.moved[0] = saved_ordinal, saved


@kaio.gpu_kernel(block_size=256)
def scale(x: f32[:], out: f32[:], a: f32, n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * kaio.block_dim_x()
    if i < n:
        out[i] = x[i] * a


def test_a_launch_with_the_last_arguments_reuses_their_packed_buffer(fake_driver, monkeypatch):
    """DeviceArray arguments: a launch with the arguments its parameter buffer was last
    packed for (arrays by identity, an int parameter by value, a float by identity) skips
    the packing; a new array, a new scalar value, a failed packing or another binding
    (stream) always launches what it was given; arguments taking turns find their buffers."""
    from kaio.runtime import launcher as launcher_mod

    calls, loaded = fake_driver
    dev = loaded.device
    x, out = fake_device_array(dev, 0x1000, (8,), (4,)), fake_device_array(dev, 0x2000, (8,), (4,))
    other = fake_device_array(dev, 0x3000, (8,), (4,))
    args = (x, out, 2.0, 8)
    packs = []

    def launcher(buffers: int):
        monkeypatch.setattr(launcher_mod, "REUSED_BUFFERS", buffers)
        bind = build(scale, scale.specialize({}, ("C", "C")), loaded, args)
        pack = bind.__globals__["pack"]
        bind.__globals__["pack"] = lambda buf, at, *values: (
            packs.append(values),
            pack(buf, at, *values),
        )
        return bind

    def launched() -> tuple:
        return struct.unpack("=QqQqfI", calls[-1][5][:40])

    bind = launcher(1)
    launch = bind(GRID, BLOCK, 0, 0x77)
    assert launch(args) and len(packs) == 1
    assert launch(args) and launch((x, out, 2.0, int("8"))) and len(packs) == 1
    assert launched() == (0x1000, 8, 0x2000, 8, 2.0, 8)
    assert launch((x, other, 2.0, 8)) and len(packs) == 2  # a new array
    assert launched() == (0x1000, 8, 0x3000, 8, 2.0, 8)
    assert launch((x, other, 2.0, 5)) and launched()[-1] == 5  # a new int value
    assert launch((x, other, 3.0, 5)) and launched()[-2] == 3.0  # a new float
    assert launch((x, other, -0.0, 5)) and calls[-1][5][32:36] == struct.pack("=f", -0.0)
    assert launch((x, other, 0.0, 5)) and calls[-1][5][32:36] == struct.pack("=f", 0.0)
    n = len(packs)
    assert not launch((x, Tensor(0x3000, (8,), (1,)), 0.0, 5))  # another kind of array
    assert not launch((x, other, 0.0, -1))  # u32 cannot hold -1: nothing launched...
    assert launch((x, other, 0.0, 5)) and len(packs) == n + 2  # ...and the buffer repacked
    assert launched() == (0x1000, 8, 0x3000, 8, 0.0, 5)
    elsewhere = bind(GRID, BLOCK, 0, 0x99)  # another stream: the same buffers
    assert elsewhere((x, other, 0.0, 5)) and calls[-1][4] == 0x99 and launched()[-1] == 5
    # a buffer is only written by the launch that took it off the free list: one held
    # elsewhere (another thread's launch) leaves this one a new buffer
    free = bind.__globals__["free"]
    held = free.popleft()
    assert launch(args) and launched() == (0x1000, 8, 0x2000, 8, 2.0, 8)
    free.clear()
    free.append(held)
    assert launch((x, other, 0.0, 5)) and launched() == (0x1000, 8, 0x3000, 8, 0.0, 5)
    assert len(calls) == 12
    # two buffers taken in turn: arguments taking turns each find the buffer packed for them
    launch = launcher(2)(GRID, BLOCK, 0, 0)
    n = len(packs)
    for _ in range(3):
        assert launch(args) and launched() == (0x1000, 8, 0x2000, 8, 2.0, 8)
        assert launch((x, other, 2.0, 8)) and launched() == (0x1000, 8, 0x3000, 8, 2.0, 8)
    assert len(packs) == n + 2
    # torch tensors are never taken as the last ones (their address and shape can change
    # under the same object): their launcher reads them on every launch
    t = Tensor(0x4000, (8,), (1,))
    torch_launch = build(scale, scale.specialize({}, ("C", "C")), loaded, (t, t, 2.0, 8))
    assert "_info" not in torch_launch.source and "same" not in torch_launch.source
    monkeypatch.setattr(launcher_mod, "REUSE_PACKED", False)  # KAIO_REUSE_PACKED=0
    assert "same" not in build(scale, scale.specialize({}, ("C", "C")), loaded, args).source


def test_direct_launch_hands_other_calls_to_its_fallback(fake_driver):
    """``direct`` (what ``kernel[config]`` hands out) takes the arguments as parameters and
    launches a call of the full signature itself; a missing argument, one too many, or
    keywords go to the fallback as they were given."""
    calls, loaded = fake_driver
    dev = loaded.device
    x, y, out = (fake_device_array(dev, p, (8,), (4,)) for p in (0x1000, 0x2000, 0x3000))
    args = (x, y, out, 8)
    launch = build(add, add.specialize({}, ("C", "C", "C")), loaded, args)(GRID, BLOCK, 0, 0)
    fallen = []
    direct = launch.make_direct(lambda *a, **k: fallen.append((a, k)))
    assert direct(*args) is None and len(calls) == 1 and not fallen
    direct(x, y, out)
    direct(x, y, out, 8, 9)
    direct(x, y, out=out, n=8)
    direct(x, y, out, 2.5)  # not a u32: the fallback explains
    assert fallen == [
        ((x, y, out), {}),
        ((x, y, out, 8, 9), {}),
        ((x, y), {"out": out, "n": 8}),
        ((x, y, out, 2.5), {}),
    ]
    assert len(calls) == 1


@contextlib.contextmanager
def set_to(flag: list, value):
    """``flag[0]`` (a module's one-item list) set to ``value`` for the block."""
    saved, flag[0] = flag[0], value
    try:
        yield
    finally:
        flag[0] = saved


def c_driver(monkeypatch, calls: list, fmt: str) -> list:
    """A stand-in for ``cuLaunchKernelEx`` that a native front can call (a C callback),
    made the launchers' driver call (on the current context and on another): it records
    (function, stream, the parameters unpacked by ``fmt``, a ``param_format``) in ``calls``
    and fails (700) while the one-item list returned counts calls to fail."""
    from kaio.runtime import launcher as launcher_mod

    failing = [0]
    entries = len(launcher_mod.entry_offsets(fmt))

    def driver_call(config, function, params, extra):
        cfg = launcher_mod.LaunchConfigStruct.from_address(config)
        pointers = (ctypes.c_void_p * entries).from_address(params)
        packed = ctypes.string_at(pointers[0], struct.calcsize(fmt))
        calls.append((function, cfg.stream or 0, struct.unpack(fmt, packed)))
        if failing[0]:
            failing[0] -= 1
            return 700
        return 0

    call = ctypes.PYFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 4)(driver_call)
    monkeypatch.setattr(launcher_mod, "raw_launch_kernel", lambda: call)
    monkeypatch.setattr(launcher_mod, "launcher_elsewhere",
                        lambda device: lambda *args: call(*args, None))  # fmt: skip
    return failing


@pytest.fixture
def thread_context(monkeypatch):
    """A stand-in for ``cuCtxGetCurrent`` (a C callback) for the native fronts, which gives
    the context in the one-item list yielded: the fake GPU's (``fake_driver``) to begin
    with."""
    from kaio.runtime import launcher as launcher_mod

    context = [0xC0]

    def get_current(into):
        ctypes.c_void_p.from_address(into).value = context[0]
        return 0

    getter = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(get_current)
    address = ctypes.cast(getter, ctypes.c_void_p).value
    monkeypatch.setattr(launcher_mod, "context_getter", lambda: address)
    yield context


def test_a_native_front_launches_the_last_arguments_and_hands_the_rest_back(
    fake_driver, monkeypatch, thread_context
):
    """A launcher whose launches reuse their parameters hands out a native front
    (``native.launch_front``) when the driver call is a C function (here a ctypes callback
    that records the launch): the arguments launched last launch again with no Python (no
    parameter buffer taken off the free list); new arguments, keywords, a ``simulate()``
    block, a recording, a thread whose current context is another, another binding's
    configuration and a failed driver call go to ``direct``, which launches what it was
    given; a buffer packed again is forgotten by the front first, so arguments taking turns
    launch their own. Whether a thread has moved off GPU 0 does not matter to a launcher of
    arrays."""
    from kaio.runtime import device as device_mod
    from kaio.runtime import launch as launch_mod
    from kaio.runtime import launcher as launcher_mod
    from kaio.runtime import native
    from kaio.sim import mode

    calls, loaded = fake_driver
    failing = c_driver(monkeypatch, calls, "=QqQqQqI")
    if not native.fronts(2, launcher_mod._WRAPPER):
        pytest.skip(f"no native front here: {native._why_not}")
    monkeypatch.setattr(launcher_mod, "REUSED_BUFFERS", 1)
    dev = loaded.device
    x, y, out = (fake_device_array(dev, p, (8,), (4,)) for p in (0x1000, 0x2000, 0x3000))
    bind = build(add, add.specialize({}, ("C", "C", "C")), loaded, (x, y, out, 8))
    env = bind.__globals__
    taken = []
    take = env["take"]
    env["take"] = lambda: (taken.append(1), take())[1]
    fallen = []
    first = bind(GRID, BLOCK, 0, 0)
    direct = first.make_direct(lambda *a, **k: fallen.append((a, k)))
    assert isinstance(direct, functools.partial)

    def launched(*args, stream=0, python: bool):
        before = len(taken)
        assert direct(*args) is None
        assert len(taken) == before + python  # the Python path takes a buffer
        assert calls[-1][0] == 0xF00 and calls[-1][1] == stream
        return calls[-1][2]

    n = 8
    expect = (0x1000, 8, 0x2000, 8, 0x3000, 8, 8)
    assert launched(x, y, out, n, python=True) == expect
    assert launched(x, y, out, n, python=False) == expect
    assert driver.last_launched_slot(0)[0] == "add"
    driver.last_launched_slot(0)[0] = "other"
    assert launched(x, y, out, n, python=False) == expect
    assert driver.last_launched_slot(0)[0] == "add"
    # arguments taking turns (one buffer): each launches its own
    for _ in range(2):
        assert launched(y, x, out, n, python=True) == (0x2000, 8, 0x1000, 8, 0x3000, 8, 8)
        assert launched(x, y, out, n, python=True) == expect
    thousand = int("1000")
    assert launched(x, y, out, thousand, python=True)[-1] == 1000
    assert launched(x, y, out, thousand, python=False)[-1] == 1000
    assert launched(x, y, out, 1000, python=False)[-1] == 1000  # equal ints: the front
    assert launched(x, y, out, 1, python=True)[-1] == 1
    assert launched(x, y, out, True, python=True)[-1] == 1  # a bool is not an int
    assert launched(x, y, out, 9, python=True)[-1] == 9
    # the guards: a simulate() block or a recording anywhere, another context current
    count = len(calls)
    for flag in (mode.anywhere, launch_mod.recordings):
        with set_to(flag, 1):
            direct(x, y, out, 9)
    direct(x, y, out, n=9)
    direct(x._info, y, out, 9)  # an ArgInfo is not the array it describes
    assert len(calls) == count and len(fallen) == 4 and fallen[2] == ((x, y, out), {"n": 9})
    thread_context[0] = 0xC1
    assert launched(x, y, out, 9, python=True)[-1] == 9
    assert launched(x, y, out, 9, python=True)[-1] == 9
    thread_context[0] = 0xC0
    with set_to(device_mod.moved, True):
        assert launched(x, y, out, 9, python=False)[-1] == 9
    # another binding (stream): the same buffer, its own configuration
    other = bind(GRID, BLOCK, 0, 0x99).make_direct(lambda *a, **k: fallen.append((a, k)))
    assert other(x, y, out, 9) is None and calls[-1][1] == 0x99
    assert launched(x, y, out, 9, python=True)[-1] == 9
    assert launched(x, y, out, 9, python=False)[-1] == 9
    # a failed driver call: the front hands the call to Python, which launches again
    failing[0] = 2
    with pytest.raises(CudaError, match="launching add"):
        direct(x, y, out, 9)
    assert len(calls) == count + 8 and len(fallen) == 4  # the front's call, then Python's
    failing[0] = 1
    assert launched(x, y, out, 9, python=True)[-1] == 9
    # two buffers, each with its memo: arguments taking turns launch from the front
    monkeypatch.setattr(launcher_mod, "REUSED_BUFFERS", 2)
    bind = build(add, add.specialize({}, ("C", "C", "C")), loaded, (x, y, out, 8))
    take = bind.__globals__["take"]
    bind.__globals__["take"] = lambda: (taken.append(1), take())[1]
    direct = bind(GRID, BLOCK, 0, 0).make_direct(lambda *a, **k: fallen.append((a, k)))
    turned = (0x2000, 8, 0x1000, 8, 0x3000, 8, 8)
    for turn in range(3):
        assert launched(x, y, out, n, python=turn == 0) == expect
        assert launched(y, x, out, n, python=turn == 0) == turned
    assert launched(x, x, out, n, python=True)[:4] == (0x1000, 8, 0x1000, 8)  # a third set
    assert launched(y, x, out, n, python=False) == turned  # its buffer kept
    assert launched(x, y, out, n, python=True) == expect  # packed again: forgotten first


def test_a_launch_of_torch_tensors_checks_them_at_once(fake_driver, monkeypatch):
    """A launcher of torch tensors checks them with one guard of the last launch's shapes
    (``launcher.guard_setup``): a hit reads each tensor's address alone and packs the
    guard's dims; anything the guard refuses takes the tensors' own checks (a new shape
    launches what it was given, a wrong dtype nothing), and two launches in a row with new
    shapes make a guard of those. CPU tensors here, the fake GPU made their device (-1)."""
    torch = pytest.importorskip("torch")
    from kaio.runtime import launcher as launcher_mod

    calls, loaded = fake_driver
    loaded.device.ordinal = -1
    x, y = torch.rand(8), torch.rand(8)
    out = torch.empty(16)[::2]

    def build_cpu(args):  # describe() refuses CPU tensors: their ArgInfos made here
        infos = {k: ArgInfo(t.data_ptr(), tuple(t.shape), t.stride(), f32, -1)
                 for k, t in enumerate(args[:3])}  # fmt: skip
        loaded.params = add.specialize({}, ("C", "C", "A")).function.params
        return build_launcher(add, add.specialize({}, ("C", "C", "A")), loaded, args, infos)

    bind = build_cpu((x, y, out, 8))
    assert "hit = g[0](a0, a1, a2)" in bind.source
    launch = bind(GRID, BLOCK, 0, 0)
    guards = bind.__globals__["GUARD"]
    first = guards[0]
    assert first[1:] == ((8,), (8,), (8, 2))

    def launched() -> tuple:
        return struct.unpack("=QqQqQqqI", calls[-1][5][:60])

    def pointers(*tensors) -> tuple:
        return tuple(t.data_ptr() for t in tensors)

    for _ in range(2):
        assert launch((x, y, out, 8)) and guards[0] is first
        assert launched() == (x.data_ptr(), 8, y.data_ptr(), 8, out.data_ptr(), 8, 2, 8)
    guards[0] = (first[0], (8,), (8,), (8, 5))  # a hit packs the guard's dims
    assert launch((x, y, out, 8)) and launched()[5:7] == (8, 5)
    guards[0] = first
    x2, y2, out2 = torch.rand(12), torch.rand(12), torch.empty(36)[::3]
    for turn in range(3):  # new shapes: own checks, then a guard of them from the second
        assert launch((x2, y2, out2, 12))
        got = launched()
        assert got[::2][:3] == pointers(x2, y2, out2) and got[1::2] == (12, 12, 12, 12)
        assert got[-2] == 3 and (guards[0][1:] == ((12,), (12,), (12, 3))) == (turn > 0)
    n = len(calls)
    assert not launch((x2.half(), y2, out2, 12))  # a wrong dtype: nothing launched
    assert not launch((x2, y2, x2, 12))  # contiguous where the launcher has 'A'
    assert not launch((x2, y2, out2, -1))  # u32 cannot hold -1
    assert len(calls) == n
    w = torch.rand(12, requires_grad=True)  # refused by the guard, taken by its own checks
    assert launch((w, y2, out2, 12)) and launched()[0] == w.data_ptr()
    monkeypatch.setattr(launcher_mod, "TORCH_GUARDS", False)
    assert "GUARD" not in build_cpu((x, y, out, 8)).source


def test_a_native_front_of_torch_tensors_reads_their_addresses_on_every_launch(
    fake_driver, monkeypatch, thread_context
):
    """A launcher of torch tensors tested by a guard (``launcher.guard_setup``) hands out a
    native front (``launch_front``'s ``tensors``) when the driver call is a C function: a
    call whose tensors pass the guard and whose other arguments are the last launch's
    launches with no Python, each tensor's address read anew (new tensors, a tensor
    ``set_`` to other memory: never a remembered address); new shapes, strides, dtypes,
    ``requires_grad``, a subclass, another scalar, keywords, the module flags, another
    context, a failed driver call go to Python, which launches what it was given (or
    nothing), and the front launches the dims of the guard its memo holds. CPU tensors
    here, the fake GPU made their device (-1)."""
    torch = pytest.importorskip("torch")
    from kaio.runtime import launch as launch_mod
    from kaio.runtime import launcher as launcher_mod
    from kaio.runtime import native
    from kaio.sim import mode

    calls, loaded = fake_driver
    failing = c_driver(monkeypatch, calls, "=QqQqQqqI")
    if not native.fronts(2, launcher_mod._WRAPPER, tensors=True):
        pytest.skip(f"no native front here: {native._why_not}")
    loaded.device.ordinal = -1
    spec = add.specialize({}, ("C", "C", "A"))
    loaded.params = spec.function.params
    x, y, out = torch.rand(8), torch.rand(8), torch.empty(16)[::2]
    infos = {k: ArgInfo(t.data_ptr(), tuple(t.shape), t.stride(), f32, -1)
             for k, t in enumerate((x, y, out))}  # fmt: skip
    bind = build_launcher(add, spec, loaded, (x, y, out, 8), infos)
    env = bind.__globals__
    taken = []
    take = env["take"]
    env["take"] = lambda: (taken.append(1), take())[1]
    fallen = []
    direct = bind(GRID, BLOCK, 0, 0).make_direct(lambda *a, **k: fallen.append((a, k)))
    assert isinstance(direct, functools.partial)

    def launched(*args, python: bool) -> tuple:
        before = len(taken)
        assert direct(*args) is None
        assert len(taken) == before + python  # the Python path takes a buffer
        return calls[-1][2]

    def expect(a, b, c, n=8, dims=(8, 8, 8, 2)) -> tuple:
        return (a.data_ptr(), dims[0], b.data_ptr(), dims[1], c.data_ptr(), *dims[2:], n)

    n = 8
    assert launched(x, y, out, n, python=True) == expect(x, y, out)
    for _ in range(2):
        assert launched(x, y, out, n, python=False) == expect(x, y, out)
    # other tensors of the guard's shapes, and one tensor pointed at other memory
    x2, y2, out2 = torch.rand(8), torch.rand(8), torch.empty(16)[::2]
    assert launched(y2, x2, out2, n, python=False) == expect(y2, x2, out2)
    x.set_(torch.rand(8))
    assert launched(x, y, out, n, python=False) == expect(x, y, out)
    # what the guard refuses: its own checks, then launched (or not) by Python
    wide = torch.empty(24)[::3]
    assert launched(x, y, wide, n, python=True) == expect(x, y, wide, dims=(8, 8, 8, 3))
    assert launched(x, y, out, n, python=True) == expect(x, y, out)  # packed anew: dropped
    longer = torch.rand(12)
    assert launched(longer, y, out, n, python=True)[:2] == (longer.data_ptr(), 12)
    w = torch.rand(8, requires_grad=True)
    assert launched(w, y, out, n, python=True) == expect(w, y, out)

    class Sub(torch.Tensor):
        pass

    count = len(calls)
    for args in ((x.half(), y, out, n), (Sub(x), y, out, n)):
        assert direct(*args) is None
    assert len(calls) == count and len(fallen) == 2  # refused by Python: the fallback's
    assert launched(x, y, out, n, python=True) == expect(x, y, out)  # the memo was dropped
    assert launched(x, y, out, n, python=False) == expect(x, y, out)
    # another scalar: by identity, an int by value
    thousand = int("1000")
    assert launched(x, y, out, thousand, python=True)[-1] == 1000
    assert launched(x, y, out, thousand, python=False)[-1] == 1000
    assert launched(x, y, out, 1000, python=False)[-1] == 1000  # equal ints: the front
    assert launched(x, y, out, 999, python=True)[-1] == 999
    # keywords, the module flags, another context
    count = len(calls)
    direct(x, y, out, n=9)
    for flag in (mode.anywhere, launch_mod.recordings):
        with set_to(flag, 1):
            direct(x, y, out, 9)
    assert len(calls) == count and len(fallen) == 5
    thread_context[0] = 0xC1
    assert launched(x, y, out, 9, python=True)[-1] == 9
    assert launched(x, y, out, 9, python=True)[-1] == 9
    thread_context[0] = 0xC0
    assert launched(x, y, out, 9, python=False) == expect(x, y, out, 9)
    # the memo's guard is the one whose dims its buffer holds: a new guard's reach the
    # buffer with the next launch Python makes, and the front launches those after it
    guards = env["GUARD"]
    guards[0] = (guards[0][0], (8,), (8,), (8, 5))
    assert launched(x, y, out, 9, python=False) == expect(x, y, out, 9)
    thread_context[0] = 0xC1
    assert launched(x, y, out, 9, python=True) == expect(x, y, out, 9, dims=(8, 8, 8, 5))
    thread_context[0] = 0xC0
    assert launched(x, y, out, 9, python=False) == expect(x, y, out, 9, dims=(8, 8, 8, 5))
    # a failed driver call: the front's, then Python's, which raises
    failing[0] = 2
    count = len(calls)
    with pytest.raises(CudaError, match="launching add"):
        direct(x, y, out, 9)
    assert len(calls) == count + 2
    monkeypatch.setattr(launcher_mod, "TORCH_FRONTS", False)
    unfronted = build_launcher(add, spec, loaded, (x, y, out, 8), infos)(GRID, BLOCK, 0, 0)
    assert not isinstance(unfronted.make_direct(print), functools.partial)


def test_a_native_front_launches_only_from_a_buffer_no_launch_packed_again_meanwhile(
    fake_driver, monkeypatch, thread_context
):
    """A front of torch tensors whose ``data_ptr()`` runs Python (a ``__torch_function__``
    subclass) that launches the same launcher with another count (packed by Python into the
    same buffer): the outer launch sees its memo gone and hands its call to Python, which
    launches its own count; without the Python, the front launches alone."""
    torch = pytest.importorskip("torch")
    from kaio.runtime import launcher as launcher_mod
    from kaio.runtime import native

    calls, loaded = fake_driver
    c_driver(monkeypatch, calls, "=QqQqQqI")
    if not native.fronts(2, launcher_mod._WRAPPER, tensors=True):
        pytest.skip(f"no native front here: {native._why_not}")
    hooks = []

    class Hooked(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.data_ptr and hooks:
                hooks.pop()()
            return super().__torch_function__(func, types, args, kwargs or {})

    Hooked.__module__ = "torch.hooked"  # what the launcher takes for torch's
    loaded.device.ordinal = -1
    spec = add.specialize({}, ("C", "C", "C"))
    loaded.params = spec.function.params
    x, y, out = (torch.rand(8).as_subclass(Hooked) for _ in range(3))
    infos = {k: ArgInfo(t.data_ptr(), (8,), (1,), f32, -1) for k, t in enumerate((x, y, out))}
    bind = build_launcher(add, spec, loaded, (x, y, out, 8), infos)
    env = bind.__globals__
    taken = []
    take = env["take"]
    env["take"] = lambda: (taken.append(1), take())[1]
    direct = bind(GRID, BLOCK, 0, 0).make_direct(lambda *a, **k: 1 / 0)
    assert isinstance(direct, functools.partial)
    n = 8
    direct(x, y, out, n)
    direct(x, y, out, n)
    assert len(taken) == 1 and calls[-1][2][-1] == 8  # the front's launch
    hooks.append(lambda: direct(x, y, out, 7))  # Python packs 7 into the buffer
    direct(x, y, out, n)
    assert [c[2][-1] for c in calls[-2:]] == [7, 8] and len(taken) == 3
    direct(x, y, out, n)  # the outer launch's memo: the front's again
    assert len(taken) == 3 and calls[-1][2][-1] == 8
