"""Loading kernels: PTX compiled by the driver's JIT as a whole program when its module
loads (no toolkit; or, with ``KAIO_PTXAS``, built into a cubin by a ptxas executable), module
images cached on disk and loaded modules in memory,
function attributes, and the opt-in to more than 48 KB of dynamic shared memory."""

from __future__ import annotations

import ctypes
import json
import os
import re
import threading
from dataclasses import dataclass, field

from kaio.errors import CudaError, LaunchError
from kaio.ir.nodes import Param, Var
from kaio.limits import static_shared_bytes
from kaio.ptx import ptxas as _ptxas
from kaio.ptx.debug import declares_record
from kaio.runtime.cache import DiskCache, cache_key
from kaio.runtime.debug import DebugRecord
from kaio.runtime.device import Device, visiting
from kaio.runtime.driver import (
    check,
    check_ptx_supported,
    cu,
    cuda_error,
    driver_version,
    format_version,
    libcuda,
    max_ptx_isa,
)
from kaio.types import is_scalar_type_name, scalar_type

__all__ = [
    "LoadedKernel",
    "Resources",
    "select_arch",
    "build_image",
    "load_image",
    "load",
    "disk_cache",
    "check_static_shared",
]

_CU_JIT_ERROR_LOG_BUFFER = 5
_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
_LOG_BYTES = 16384

_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$%][\w$]*)")
_REQNTID = re.compile(r"\.reqntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")
_MAXNTID = re.compile(r"\.maxntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")
_CLUSTER = re.compile(r"\.reqnctapercluster\s+(\d+)")
_GRID_WAIT = re.compile(r"^\s*griddepcontrol\.wait\b", re.MULTILINE)


@dataclass
class Resources:
    """What one compiled kernel uses, as the driver reports it."""

    registers: int
    local_bytes: int
    shared_bytes: int
    const_bytes: int
    max_threads_per_block: int


@dataclass(eq=False)
class LoadedKernel:
    """A kernel loaded on one device: its ``CUfunction`` (``handle`` as an int for ctypes),
    the module that owns it, and the block constraints its PTX declares."""

    name: str
    module: object
    function: object
    handle: int
    device: Device
    reqntid: tuple | None
    maxntid: int | None
    from_disk: bool
    params: list  # the kernel's parameters (kaio.ir.nodes.Param) in launch order
    dynamic_shared_limit: int = 0
    debug: DebugRecord | None = None  # debug mode: the bounds checks' error record
    cluster: int | None = None  # blocks per cluster along x (kaio.cluster_dims)
    pdl: bool = False  # launched with programmatic stream serialization (grid_dependency_wait)
    _clusters: dict = field(default_factory=dict)  # max_active_clusters, by configuration

    def attribute(self, name: str) -> int:
        """A ``CU_FUNC_ATTRIBUTE_*`` value (``"NUM_REGS"``, ``"LOCAL_SIZE_BYTES"``...)."""
        attr = getattr(cu.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
        return check(cu.cuFuncGetAttribute(attr, self.function), f"cuFuncGetAttribute({name})")

    def resources(self) -> Resources:
        """Registers, local (spill) bytes, static shared bytes, constant bytes, max threads."""
        return Resources(
            registers=self.attribute("NUM_REGS"),
            local_bytes=self.attribute("LOCAL_SIZE_BYTES"),
            shared_bytes=self.attribute("SHARED_SIZE_BYTES"),
            const_bytes=self.attribute("CONST_SIZE_BYTES"),
            max_threads_per_block=self.attribute("MAX_THREADS_PER_BLOCK"),
        )

    def max_active_clusters(self, threads: int, shared_bytes: int) -> int:
        """How many clusters of this kernel, with ``threads`` threads a block and
        ``shared_bytes`` of dynamic shared memory, run at once on its GPU
        (``cuOccupancyMaxActiveClusters``; asked once per configuration). A persistent kernel
        launches that many: more would wait for the first ones to finish."""
        key = (threads, shared_bytes)
        known = self._clusters.get(key)
        if known is not None:
            return known
        if not self.cluster:
            raise LaunchError(
                f"{self.name}: max_active_clusters() is for kernels with kaio.cluster_dims(); "
                "this one launches single blocks"
            )
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = self.cluster, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
        config.sharedMemBytes = shared_bytes
        dims = cu.CUlaunchAttribute()
        dims.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        dims.value.clusterDim.x, dims.value.clusterDim.y, dims.value.clusterDim.z = (
            self.cluster, 1, 1
        )  # fmt: skip
        config.attrs = [dims]
        config.numAttrs = 1
        with visiting(self.device):
            self.allow_dynamic_shared(shared_bytes)
            count = check(
                cu.cuOccupancyMaxActiveClusters(self.function, config),
                "cuOccupancyMaxActiveClusters",
            )
        self._clusters[key] = int(count)
        return int(count)

    def allow_dynamic_shared(self, nbytes: int) -> None:
        """Make ``nbytes`` of dynamic shared memory launchable, opting in above the default
        per-block limit (48 KB); over the device's opt-in limit raises ``LaunchError``."""
        if nbytes <= self.dynamic_shared_limit:
            return
        static = self.attribute("SHARED_SIZE_BYTES")
        if static + nbytes > self.device.max_shared_per_block:
            limit = self.device.max_shared_per_block_optin
            if static + nbytes > limit:
                raise LaunchError(
                    f"{self.name}: {nbytes} bytes of dynamic shared memory (+ {static} static) "
                    f"is over the {limit} bytes a block may use on {self.device.name} "
                    f"({self.device.arch}); use smaller tiles"
                )
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(cu.cuFuncSetAttribute(self.function, attr, nbytes), "cuFuncSetAttribute")
        self.dynamic_shared_limit = nbytes


def _arch_number(arch: str) -> int:
    m = re.fullmatch(r"sm_(\d+)[af]?", arch)
    if m is None:
        raise LaunchError(f"arch must look like 'sm_90', got {arch!r}")
    return int(m.group(1))


def select_arch(requested: str | None, device: Device) -> str:
    """The arch to compile for: the kernel's own (it must not be newer than the GPU), else the
    GPU's."""
    if requested is None:
        return device.arch
    if _arch_number(requested) > _arch_number(device.arch):
        raise LaunchError(
            f"the kernel is compiled for {requested} but {device.name} is {device.arch}: "
            f"drop arch= from the decorator or set it to {device.arch} or older"
        )
    return requested


_compiler: tuple[str, str] | None = None  # (ptxas path or "", its build) once read


def compiler() -> tuple[str, str]:
    """Which compiler builds kernels, as ``(ptxas path, its build)``, or ``("", "")`` for
    the driver's JIT (the default). ``KAIO_PTXAS`` chooses, read once a process: unset, empty
    or ``0``, the driver; ``1`` or ``auto``, the ptxas ``kaio.ptx.ptxas.find_ptxas`` finds
    (the ``nvidia-cuda-nvcc`` wheel, then ``PATH``); anything else, the path of a ptxas,
    whose cubins the disk cache keeps (``kaio cubins``)."""
    global _compiler
    if _compiler is None:
        choice = os.environ.get("KAIO_PTXAS", "").strip()
        if choice in ("", "0"):
            _compiler = ("", "")
        else:
            path = _ptxas.find_ptxas() if choice in ("1", "auto") else choice
            if path is None or not os.access(path, os.X_OK):
                raise LaunchError(
                    f"KAIO_PTXAS={choice!r}: no ptxas executable "
                    + ("was found" if path is None else f"at {path}")
                    + "; pip install nvidia-cuda-nvcc (no newer than the driver's CUDA), "
                    "name a ptxas path, or unset KAIO_PTXAS to use the driver's JIT"
                )
            _compiler = (path, _ptxas.version(path))
    return _compiler


DRIVER_JIT = "driver JIT, whole program"  # the cache-key name of the driver's builds


def build_image(ptx: str, name: str, arch: str, device: Device) -> bytes:
    """The module image of ``ptx`` (compiled for ``arch``) that ``cuModuleLoadData`` takes on
    ``device``: with ``KAIO_PTXAS``, a cubin that ptxas builds for the device's own
    architecture; by default the PTX itself, which the driver compiles when the module loads.
    Why not the driver's linker (``cuLinkAddData``), which returns a cubin: it compiles PTX as
    relocatable code (``ptxas -c``), which holds a kernel that raises registers with
    ``setmaxnreg`` to fewer of them and spills (the Hopper attention forward's overlapped
    schedule: 128 bytes of local memory, none as a whole program)."""
    path = compiler()[0]
    if not path:
        return ptx.encode() + b"\0"
    try:
        return _ptxas.build_cubin(ptx, path, device.arch)
    except RuntimeError as error:
        raise LaunchError(f"compiling kernel {name} with KAIO_PTXAS: {error}") from None


def is_cubin(image: bytes) -> bool:
    """Whether a module image is a cubin (an ELF file), not PTX for the driver's JIT."""
    return image[:4] == b"\x7fELF"


def load_image(image: bytes, name: str, arch: str):
    """Load a module image (``build_image``) into the current context: a cubin as is, PTX
    compiled by the driver's JIT as a whole program. CudaError with the JIT's log when the
    driver refuses it."""
    lib = libcuda()
    log = ctypes.create_string_buffer(_LOG_BYTES)
    options = (ctypes.c_int * 2)(_CU_JIT_ERROR_LOG_BUFFER, _CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
    values = (ctypes.c_void_p * 2)(ctypes.addressof(log), _LOG_BYTES)
    module = ctypes.c_void_p()
    rc = lib.cuModuleLoadDataEx(ctypes.byref(module), image, 2, options, values)
    if rc == 0:
        return cu.CUmodule(module.value)
    how = "loading the cubin" + _by_ptxas() if is_cubin(image) else "compiling (driver JIT)"
    error = cuda_error(rc, f"{how} of kernel {name} for {arch}")
    text = log.value.decode(errors="replace").strip()
    if error.name == "CUDA_ERROR_UNSUPPORTED_PTX_VERSION":
        top = max_ptx_isa(driver_version())
        text += (
            f"\nthis driver (CUDA {format_version(driver_version())}) loads PTX ISA up "
            f"to {top[0]}.{top[1]}: update the NVIDIA driver"
        )
    raise type(error)(f"{error}\n{text}" if text else str(error), error.name, error.code)


_disk_cache: DiskCache | None = None


def disk_cache() -> DiskCache:
    """The process's cubin cache (directory read from the environment on first use)."""
    global _disk_cache
    if _disk_cache is None:
        _disk_cache = DiskCache()
    return _disk_cache


def _dims(match) -> tuple:
    return tuple(int(g) if g else 1 for g in match.groups())


_loaded: dict[tuple, LoadedKernel] = {}
_load_lock = threading.RLock()  # each kernel is linked and loaded once, by one thread


def load(spec, device: Device, arch: str) -> LoadedKernel:
    """The kernel of specialization ``spec`` compiled for ``arch`` and loaded on ``device``
    (whose context is current); built once per process, its cubin cached on disk."""
    memo = (spec.key, arch, device.ordinal)
    loaded = _loaded.get(memo)
    if loaded is not None:
        return loaded
    with _load_lock:
        loaded = _loaded.get(memo)
        if loaded is None:
            loaded = _loaded[memo] = _load(spec, device, arch)
    return loaded


def check_static_shared(function, name: str, device: Device) -> None:
    """Refuse, before the driver's JIT does less clearly, a kernel whose static shared arrays
    exceed what one block may declare statically (48 KB; more needs dynamic shared memory)."""
    arrays = static_shared_bytes(function)
    total = sum(n for _, n in arrays)
    limit = device.max_shared_per_block
    if total <= limit:
        return
    listed = ", ".join(f"{a} {n}" for a, n in sorted(arrays, key=lambda x: -x[1]))
    raise LaunchError(
        f"{name}: {total} bytes of static shared memory ({listed}), but a block may declare at "
        f"most {limit} bytes statically on {device.name} ({device.arch}); move the large "
        f"arrays to kaio.shared_dynamic(dtype, shape) and pass shared_bytes at launch (up to "
        f"{device.max_shared_per_block_optin} bytes per block on this GPU), or use smaller tiles"
    )


def _load(spec, device: Device, arch: str) -> LoadedKernel:
    """Load one kernel: from the disk cache, which holds each module image (``build_image``)
    with what a launch needs to know of the kernel (entry name, block constraints,
    parameters), so that a new process does not compile the Python (the driver keeps its own
    cache of what its JIT built); else compile, load and cache it. ``load`` without the
    memo."""
    cache = disk_cache()
    key = cache_key(spec.key, arch, driver_version(), compiler()[1] or DRIVER_JIT)
    cached = None if spec.kernel.debug else unpack_entry(cache.get(key))
    if cached is not None and not fits_kernel(cached[0], spec.kernel, spec.layouts):
        cached = None
    if cached is not None:
        loaded = _load_cached(*cached, device)
        if loaded is not None:
            return loaded
        cache.discard(key)  # an entry this driver rejects, or that names what is not there
    check_static_shared(spec.function, spec.kernel.__name__, device)
    ptx = spec.ptx(arch)
    entry = _ENTRY.search(ptx)
    if entry is None:
        raise LaunchError(f"the PTX of {spec.kernel.__name__} has no .entry")
    name = entry.group(1)
    check_ptx_supported(ptx, driver_version(), name)
    req, maxn = _REQNTID.search(ptx), _MAXNTID.search(ptx)
    meta = {
        "name": name,
        "reqntid": list(_dims(req)) if req else None,
        "maxntid": _product(_dims(maxn)) if maxn else None,
        "cluster": int(cluster.group(1)) if (cluster := _CLUSTER.search(ptx)) else None,
        "pdl": bool(_GRID_WAIT.search(ptx)),
        "params": [
            [p.name, p.role, p.source, p.dim, p.value.type.name] for p in spec.function.params
        ],
        "variant": variant(spec, arch),  # for people (kaio cubins), not read back
    }
    image = build_image(ptx, name, arch, device)
    module = load_image(image, name, arch)
    cache.put(key, pack_entry(meta, image))
    loaded = _loaded_kernel(module, meta, device, from_disk=False)
    if declares_record(ptx):
        loaded.debug = DebugRecord(name, ptx, device)
    return loaded


def _by_ptxas() -> str:
    path, build = compiler()
    if not path:
        return ""
    return f" (built by {path}, {build}: a ptxas newer than the driver's CUDA may not load)"


def _load_cached(meta: dict, image: bytes, device: Device) -> LoadedKernel | None:
    """The kernel of a cache entry, or None when the driver refuses it (the caller rebuilds
    it: cache trouble never fails a launch)."""
    err, module = cu.cuModuleLoadData(image)
    if err != cu.CUresult.CUDA_SUCCESS:
        return None
    try:
        return _loaded_kernel(module, meta, device, from_disk=True)
    except (CudaError, LaunchError, KeyError, TypeError, ValueError):  # no such function...
        cu.cuModuleUnload(module)
        return None


def variant(spec, arch: str) -> str:
    """What tells a kernel's specializations apart, for people: ``"sm_90 backend=ptx OP=softmax
    VEC=8"`` (arch, backend, constexpr values)."""
    return " ".join(
        [arch, f"backend={spec.backend}", *(f"{k}={v}" for k, v in spec.constexprs.items())]
    )


def _product(dims: tuple) -> int:
    x, y, z = dims
    return x * y * z


PORTABLE_CLUSTER = 8  # larger clusters need the function's non-portable opt-in (sm_90: 16)


def _loaded_kernel(module, meta: dict, device: Device, from_disk: bool) -> LoadedKernel:
    name = meta["name"]
    function = check(cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
    if (meta.get("cluster") or 0) > PORTABLE_CLUSTER:
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        check(cu.cuFuncSetAttribute(function, attr, 1), f"cuFuncSetAttribute({name})")
    return LoadedKernel(
        name=name,
        module=module,
        function=function,
        handle=int(function),
        device=device,
        reqntid=tuple(meta["reqntid"]) if meta["reqntid"] else None,
        maxntid=meta["maxntid"],
        cluster=meta.get("cluster"),
        pdl=meta.get("pdl", False),
        from_disk=from_disk,
        params=[
            Param(n, Var(n, scalar_type(t)), role, source, dim)
            for n, role, source, dim, t in meta["params"]
        ],
    )


def cached_cubins(cache: DiskCache | None = None) -> list[tuple[dict, str, bytes]]:
    """``(meta, key, cubin)`` of every kernel in the disk cache (default: this process's)
    built into a cubin (``KAIO_PTXAS``), sorted by kernel name: the code that runs, for
    ``cuobjdump -sass``. Entries the driver's JIT builds hold PTX (the driver compiles it
    when the module loads and keeps no cubin to hand out) and are left out, as are damaged
    and older-format entries. ``meta`` has the kernel's ``name`` and, from entries this kaio
    wrote, ``variant`` (arch, backend, constexpr values)."""
    cache = cache or disk_cache()
    out = []
    for key in cache.keys():
        entry = unpack_entry(cache.get(key))
        if entry is not None and is_cubin(entry[1]):
            out.append((entry[0], key, entry[1]))
    return sorted(out, key=lambda e: (e[0]["name"], e[1]))


_ENTRY_MAGIC = b"KAIOKRN1"


def pack_entry(meta: dict, image: bytes) -> bytes:
    """A disk-cache entry: ``meta`` (JSON) and the module image (``build_image``)."""
    text = json.dumps(meta).encode()
    return _ENTRY_MAGIC + len(text).to_bytes(4, "little") + text + image


def unpack_entry(payload: bytes | None) -> tuple[dict, bytes] | None:
    """``(meta, image)`` of a ``pack_entry`` payload; None for anything else (no entry, or
    one an older kaio wrote), which the caller rebuilds."""
    head = len(_ENTRY_MAGIC) + 4
    if payload is None or len(payload) < head or not payload.startswith(_ENTRY_MAGIC):
        return None
    length = int.from_bytes(payload[len(_ENTRY_MAGIC) : head], "little")
    if head + length > len(payload):
        return None
    try:
        meta = json.loads(payload[head : head + length])
    except (ValueError, RecursionError):
        return None
    if not valid_meta(meta):
        return None
    return meta, payload[head + length :]


_NAME = re.compile(r"[A-Za-z_$%][\w$]*")
_ROLES = {"scalar": 1, "ptr": 1, "shape": 2, "stride": 2, "tensormap": 1}  # role -> 1: no dim


def _count(x, low: int, high: int) -> bool:
    return type(x) is int and low <= x <= high


def valid_meta(meta) -> bool:
    """Whether cached metadata has every field a launch reads, each of the right type and
    range: the entry's name a PTX identifier (no path separators, so ``kaio cubins`` can
    name files after it), block and cluster dimensions in the GPU's limits, parameters
    ``[name, role, source, dim, type]`` of known roles and scalar types. Anything else is
    discarded and rebuilt."""
    if not isinstance(meta, dict) or not {"name", "reqntid", "maxntid", "params"} <= set(meta):
        return False
    name, req, maxn, cluster = meta["name"], meta["reqntid"], meta["maxntid"], meta.get("cluster")
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > 1024:
        return False
    if req is not None and not (
        isinstance(req, list) and len(req) == 3 and all(_count(d, 1, 1024) for d in req)
    ):
        return False
    if maxn is not None and not _count(maxn, 1, 1024):
        return False
    if cluster is not None and not _count(cluster, 1, 16):
        return False
    if not isinstance(meta.get("variant", ""), str) or not isinstance(meta["params"], list):
        return False
    for p in meta["params"]:
        if not (isinstance(p, list) and len(p) == 5):
            return False
        pname, role, source, dim, tname = p
        if not (
            isinstance(pname, str)
            and _NAME.fullmatch(pname)
            and isinstance(source, str)
            and role in _ROLES
            and type(dim) is int
            and (dim == -1 if _ROLES[role] == 1 else 0 <= dim < 64)
            and isinstance(tname, str)
            and is_scalar_type_name(tname)
        ):
            return False
    return True


def fits_kernel(meta: dict, kernel, layouts: tuple) -> bool:
    """Whether a (valid) cache entry's parameters are those of ``kernel`` with array
    ``layouts``, as the launch ABI lays them out: every runtime parameter in order, an array
    as its u64 pointer, i64 shape and (layout 'A') i64 strides, dimension by dimension, a
    scalar as one entry of its type, a tensor map as one u64 entry."""
    from kaio.types import ArrayType, ScalarType, TensorMapType

    want = []
    arrays = iter(layouts)
    for name, annotation in kernel.runtime_params():
        if isinstance(annotation, ArrayType):
            n = annotation.ndim
            strides = range(n) if next(arrays, "C") == "A" else ()
            want.append([name, "ptr", name, -1, "u64"])
            want += [[f"{name}_shape{d}", "shape", name, d, "i64"] for d in range(n)]
            want += [[f"{name}_stride{d}", "stride", name, d, "i64"] for d in strides]
        elif isinstance(annotation, TensorMapType):
            want.append([name, "tensormap", name, -1, "u64"])
        elif isinstance(annotation, ScalarType):
            want.append([name, "scalar", name, -1, annotation.name])
        else:
            return False
    return meta["params"] == want
