"""Call plans for ops: the first call with a signature builds a plan, later calls replay it.

An op decorated ``@planned("x", "w")`` (its array parameters, by name) gets a generated
wrapper with the op's own signature. Per call the wrapper describes each array once (a torch
tensor through its own accessors: dtype, shape, strides, device, address; others through
``describe``), and makes the key

    (each array's (dtype, shape, strides, device, address % 16), every other argument,
     the current stream of the first array's device, whether kaio.simulate() is on)

and looks it up in the op's plans. When every array is a torch tensor (or None, for an
optional one) the key is one flat tuple of torch's accessors, with ``is_contiguous()`` in place
of the strides of a contiguous tensor (its kernels never see them; a tensor that is not
contiguous is keyed by its strides, and the ops refuse it):

    (x.dtype, x.shape, x.is_contiguous() or x.stride(), x.get_device(), x.data_ptr() % 16,
     w.dtype, ..., every other argument and its type, the stream, simulate() on)

A hit allocates the outputs (an output with the shape, dtype and device of a contiguous
input as ``torch.empty_like(input)``, which costs less than ``torch.empty`` with its
keywords, or, small and dropped by the caller since the last call, that call's output
again: ``_recycled``), fills the addresses into the pre-packed parameters and launches, all
in one generated ``replay(addresses..., arrays...)`` (the plan's launches,
``kaio.runtime.plan.CallPlan.code``, inlined): no argument checks, no plan or tile choice,
no packing of shapes and scalars. A miss runs the op itself, which checks everything (a
wrong dtype, shape, device or stride raises its ``ValueError`` naming the argument, and
nothing is stored) inside ``kaio.runtime.plan.recording()``; its launches, output
allocations (``_arrays.output``) and result become the plan for that key. So an argument of
a planned call goes kaio_ops -> plan -> launch, once, top to bottom.

An op called again and again with one signature takes a shorter way: once two calls in a
row hit one plan, the next call first tries that plan's fast function (``_fast``), which
tells the call's signature by one C call over all its tensors (``tensor_check``, torch's
own ``TensorGuards``; the outputs kept to be handed out again told in the same call) and a
few comparisons (alignment, the other arguments, the stream), and replays; a call it does
not serve (MISS) turns it off and takes the key.

What the key holds is exactly what the ops' choices may depend on: shapes and dtypes (grids,
tiles, K splits), alignment (16-byte vector paths), device (SM count, arch), stream, the
non-array arguments (eps, causal, scale...). Process-wide settings read when the plan is built
(``KAIO_HOPPER_MATMUL``, ``kaio_ops.tune`` results) hold for the plan's life: ``clear()``
drops every plan after changing them.

A call that passes one array twice (``silu_gate(x, x)``) is recorded with a twin of the
array (a view of the same memory) in the second place, so that the plan knows which address
goes where, and serves calls of its key whether or not they repeat an array. A call is left
unplanned (the op runs as written, each time) when such an array has no twin (not a torch
tensor or a ``DeviceArray``), an argument is not an array this module can describe without
checks, or the op does something a plan cannot
replay: launches a kernel in debug mode, passes a kernel an array (or a tensor map over one:
the plan encodes the map again for each call's address) that is neither an input, an output
it allocated, nor one registered with ``_arrays.constant``, or returns anything but its
outputs (or None).

Adopting it in an op (kaio_ops.matmul, flash_attention_decode...): write the op as usual
with ``_arrays.Inputs`` checks, ``_arrays.output`` allocations and ``kernel[config](...)``
launches, and decorate it with ``@planned(<its array parameter names>)``. Arrays the op keeps
across calls (cached placeholders) go through ``_arrays.constant``; everything else an op
passes to its kernels must come from its inputs (``Operand.arg``, ``_arrays.arg``) or from
``_arrays.output``. ``tests/test_plans.py`` shows how to check an op's plans on the CPU.

Parameters may be keyword-only (``linear``'s ``residual``, ``activation``, ``out_dtype``):
the wrapper keeps them keyword-only, and ``wrapper.replay_only`` (the torch dispatcher's
entry) takes every parameter positionally, in signature order. An optional array given as
None is keyed as None (another plan than the same call with an array). An op that writes its
inputs and returns None (``kv_cache_append``) is planned like any other; a ``torch.nn.Parameter``
is read like a tensor.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import re
import sys
import weakref
from collections.abc import Callable

from kaio import DeviceArray, sim
from kaio.runtime import (
    CallPlan,
    RawArray,
    compile_function,
    current,
    recording,
    recordings,
)
from kaio.runtime import tensor_check as _tensor_check
from kaio_ops import _arrays

__all__ = ["MAX_PLANS", "MISS", "clear", "planned", "plans_of"]

MAX_PLANS = 256  # per op; past this the op's plans are dropped and built again as met
# an output like a contiguous input tensor (same shape, dtype, device) is made with
# torch.empty_like(input) rather than torch.empty(*shape, dtype=..., device=...)
EMPTY_LIKE = True
# an output (made like an input or not) of at most this many bytes is handed out again by
# the next call of its plan
# when the caller has dropped it and nothing else refers to it (``_recycled``); 0: never
# (``KAIO_RECYCLE_OUTPUTS=0``). On by default while nothing in the process has asked torch
# to keep memory for another stream (``Tensor.record_stream``, watched: ``_watch_streams``)
# and torch.distributed was not initialized when the plan was built
RECYCLE_BYTES = 0 if os.environ.get("KAIO_RECYCLE_OUTPUTS") == "0" else (1 << 20)
# [False] once any tensor was recorded on a stream (``Tensor.record_stream``): outputs are
# then never handed out again, in any plan, for the rest of the process
RECYCLING = [True]
MISS = object()  # replay_only's answer when the call has no plan
_NONE = ("none",)  # the key of an optional array given as None
_ALL: list[dict] = []  # every op's plans (for clear)
_CELLS: list[tuple] = []  # every op's fast path cells (FAST, LAST: for clear)


def clear() -> None:
    """Drop every op's plans (after changing a setting plans were built with)."""
    for plans in _ALL:
        plans.clear()
    for cells in _CELLS:
        for cell in cells:
            cell[0] = None


def plans_of(op: Callable) -> dict:
    """The plans of a planned op: key -> replay function (None: left unplanned)."""
    return op._plans


class _NoTorch:
    """The tensor type of wrappers made before torch was imported: nothing is one."""


# the globals of wrappers made before torch was imported; ``describe`` binds torch's types
# into them when the first torch tensor arrives (``import kaio_ops`` does not import torch)
_UNBOUND: list[dict] = []


def _torch(imported_only: bool = False):
    """(torch.Tensor, the current-raw-stream accessor), or (a type nothing is, None) when
    torch is not installed (or, with ``imported_only``, not imported yet)."""
    if imported_only and "torch" not in sys.modules:
        return _NoTorch, None
    try:
        import torch
    except ImportError:
        return _NoTorch, None
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:

        def raw(device: int) -> int:
            return torch.cuda.current_stream(device).cuda_stream

    return torch.Tensor, raw


def describe(obj) -> tuple:
    """(key, address) of an array that is not an exact ``torch.Tensor`` (those the wrapper
    reads inline), ``(None, 0)`` for anything else: such calls are never planned."""
    if obj is None:
        return _NONE, 0
    if type(obj) is DeviceArray:
        info = obj._info
        return (DeviceArray, info.sig, info.shape, info.strides, info.ptr & 15), info.ptr
    kind = _arrays._kind(obj)
    if kind == "torch" and _UNBOUND:
        _bind_torch()
        # this call runs unplanned (the wrapper's except path); the next reads the flat key
        raise _Rebound
    if kind == "torch" and hasattr(obj, "data_ptr"):  # a subclass (nn.Parameter)
        p = obj.data_ptr()
        return (type(obj), obj.dtype, obj.shape, obj.stride(), obj.get_device(), p & 15), p
    if kind == "cupy":
        p = obj.data.ptr
        key = (type(obj), obj.dtype.char, obj.shape, obj.strides, obj.data.device_id, p & 15)
        return key, p
    return None, 0


class _Rebound(Exception):
    """Torch's types were just bound into the wrappers: the call in progress runs unplanned."""


def _bind_torch() -> None:
    """Torch's tensor types and stream accessor into the wrappers made before it was
    imported."""
    tensor, raw_stream = _torch()
    parameter = sys.modules["torch.nn"].Parameter
    for env in _UNBOUND:
        env.update(T=tensor, P=parameter, RAW=raw_stream)
    _UNBOUND.clear()


def stream_key(obj, raw_stream) -> object:
    """The stream an op on ``obj`` launches on (``_arrays.stream_of``), for the key."""
    kind = _arrays._kind(obj)
    if kind == "torch" and raw_stream is not None:
        device = obj.get_device()
        return raw_stream(device) if device >= 0 else None
    if kind == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return None


class _Like:
    """What ``_arrays.new_array`` needs of the array an output was made like."""

    __slots__ = ("device",)

    def __init__(self, device):
        self.device = device


def build(recorder, arrays: list, pointers: tuple, result) -> Callable | None:
    """The replay function ``replay(*input addresses)`` of a recorded call (its array
    arguments ``arrays`` at ``pointers``, returning ``result``), or None when it cannot be
    replayed."""
    if recorder.failed is not None:
        return None
    where: dict = {}  # id -> (source index, address when recorded)
    for i, a in enumerate(arrays):
        if a is not None:
            where[id(a)] = (i, pointers[i])
    allocations = []
    for made, kind, device, like_obj, shape, dtype in recorder.allocated:
        if id(made) in _arrays._CONSTANTS:
            continue
        if kind == "numpy":
            return None
        where[id(made)] = (len(arrays) + len(allocations), _arrays._address(made, kind))
        like = _Like(like_obj.device) if kind == "kaio" else None
        twin = _input_like(arrays, like_obj, shape, dtype) if kind == "torch" else None
        allocations.append((made, kind, device, like, shape, dtype, twin))

    def viewed(address: int) -> tuple | None:
        """(source, address) of the one input or output at ``address``: the array the op
        viewed there (``b.t()``, x [B, S, K] seen as [M, K], fp8 seen as 16-bit units) is a
        view of it, which every call of the key makes alike at that array's address; None
        if none or several are there (the array is then one the op made: not replayable)."""
        at = {found for found in where.values() if found[1] == address}
        return at.pop() if len(at) == 1 else None

    steps = []
    for prepared, args in recorder.launches:
        sources = {}
        for k, e in prepared.arrays.items():
            a = args[k]
            owner = a.owner if type(a) is RawArray else a
            if id(owner) in _arrays._CONSTANTS:
                continue
            found = where.get(id(owner))
            if found is None and _arrays._kind(owner) in ("torch", "kaio", "cupy"):
                found = viewed(_arrays._address(owner, _arrays._kind(owner)))
            if found is None:
                return None  # an array made or viewed inside the op: its address is unknown
            source, base = found
            sources[k] = (source, prepared.values[e] - base)
        for k, (_e, tm) in prepared.maps.items():  # re-encoded for each call's address
            if id(tm.array) in _arrays._CONSTANTS:
                continue
            address = _arrays._address(tm.array, _arrays._kind(tm.array))
            found = where.get(id(tm.array)) or viewed(address)
            if found is None:
                return None
            source, base = found
            sources[k] = (source, address - base)
        steps.append((prepared, sources))
    index = {id(made): j for j, (made, *_) in enumerate(allocations)}

    def spell(r) -> str | None:
        if r is None:  # an op that writes in place (kv_cache_append)
            return "None"
        if isinstance(r, tuple | list):
            parts = [spell(x) for x in r]
            if None in parts:
                return None
            inner = ", ".join(parts) + ("," if len(parts) == 1 else "")
            return f"({inner})" if isinstance(r, tuple) else f"[{inner}]"
        j = index.get(id(r))
        return None if j is None else f"o{j}"

    returned = spell(result)
    if returned is None:
        return None
    return _replay(CallPlan(steps) if steps else None, len(arrays), allocations, returned)


def _twin(a) -> object | None:
    """Another object for the array ``a`` (same memory, shape, strides and type of
    description), or None for an array this module does not know how to view."""
    if type(a) is DeviceArray:
        return a._view(a.ptr, a.shape, a.strides)
    if _arrays._kind(a) == "torch":
        return a.view(a.shape)
    return None


def _twins(args: tuple, positions: list) -> tuple | None:
    """``args`` with each array passed again (``silu_gate(x, x)``, ``flash_attention(q, kv,
    kv)``) replaced by a twin of it (``_twin``), so that a recording traces every kernel
    argument to one parameter: the plan then replays calls of the key whether or not they
    pass one array twice (the key does not say; a replay only takes addresses). None when
    an array has no twin: the call runs unplanned."""
    seen: set = set()
    args = list(args)
    for i in positions:
        a = args[i]
        if a is None:
            continue
        if id(a) in seen:
            a = args[i] = _twin(a)
            if a is None:
                return None
        seen.add(id(a))
    return tuple(args)


def _input_like(arrays: list, like_obj, shape: tuple, dtype) -> int | None:
    """The position of the input tensor an output of ``shape`` and ``dtype`` can be made
    like (``torch.empty_like``, cheaper than ``torch.empty`` with its keywords): the input
    the op made it like, when that input is contiguous (every call of the key has it
    contiguous) and has that shape and dtype; None otherwise."""
    for i, a in enumerate(arrays):
        if a is like_obj and a is not None:
            try:
                same = (
                    tuple(a.shape) == shape
                    and a.dtype == _arrays.torch_dtype(dtype)
                    and a.is_contiguous()
                )
            except (AttributeError, TypeError, KeyError):
                return None
            return i if same else None
    return None


def _solo_refs() -> int | None:
    """``sys.getrefcount`` of an object a replay has just popped off its list of kept
    outputs when nothing else refers to it (2 on CPython 3.12: the local and the argument;
    interpreters that borrow references count otherwise), or None when an extra reference
    does not show in it: outputs are then never handed out again."""
    env = {"REFS": sys.getrefcount}
    exec("def probe(kept):\n    o, q = kept.pop()\n    return REFS(o)\n", env)
    probe = env["probe"]

    class Probe:
        pass

    alone = probe([(Probe(), 0)])
    held = Probe()
    return alone if probe([(held, 0)]) == alone + 1 else None


def _storage_alone(torch) -> tuple | None:
    """(the storage accessor, a use count, a reference count) that tell a kept output's
    memory is its own: the use count of its storage (``torch._C._storage_Use_Count`` of
    ``untyped_storage()``'s address) while the plan holds that storage object, when no other
    tensor shares the storage (a view made in inference mode and a ``detach()`` share it
    without showing in the tensor's own use count), and ``sys.getrefcount`` of the storage
    object as a replay pops it off its list of kept outputs, when nothing else holds it
    (torch may keep a reference of its own). None where this torch cannot tell (a probe
    tensor's ``detach()``, or another holder of its storage object, does not show):
    outputs are then never handed out again."""
    uses = getattr(torch._C, "_storage_Use_Count", None)
    if uses is None:
        return None
    env = {"REFS": sys.getrefcount}
    probe = (  # a replay's own steps: the kept output taken, told, kept again
        "def probe(kept):\n    o, q, s, c = kept.pop()\n    refs = REFS(s)\n"
        "    kept.append((o, q, s, c))\n    return refs\n"
    )
    exec(probe, env)
    try:
        tensor = torch.empty(1)
        storage = tensor.untyped_storage()
        kept, at = [(tensor, 0, storage, storage._cdata)], storage._cdata
        del tensor, storage
        alone, refs = uses(at), env["probe"](kept)
        held, shared = kept[0][2], kept[0][0].detach()
        told = env["probe"](kept) == refs + 1 and uses(at) == alone + 1
        del held, shared
        told = told and env["probe"](kept) == refs and uses(at) == alone
        return (uses, alone, refs) if told else None
    except Exception:  # noqa: BLE001 (a torch whose storages work otherwise)
        return None


def _recycled(env: dict, j: int, fresh: str, shape: tuple, dtype, made) -> tuple | None:
    """(take, make): the lines that take the output kept for ``o{j}`` (or None) and those
    that make output ``o{j}`` (a new one: the expression ``fresh``, an ``EMPTY_LIKE`` of an
    input or ``A{j}()``) and its address ``q{j}``, handing out again
    the tensor the plan's last call returned when the caller has
    dropped it: nothing else refers to it (its Python references, its TensorImpl's: no view,
    no DLPack capsule, no autograd record holds it; its storage's: no ``detach()`` nor a
    view made in inference mode shares its memory, ``_storage_alone``, the storage object
    kept with it, which nothing else holds either), and it is still what that call made
    (address, shape, contiguity, dtype, no gradient, inference mode as now). As torch's
    caching allocator would hand the same memory to the next allocation on the stream (the
    plan's), later work on the stream runs after the last call's. Never while the stream is
    being captured into a CUDA graph, nor an output made during a capture (its memory is
    the graph's). Costs a fraction of a ``torch.empty_like`` (and of freeing the last
    output). None where this torch or Python cannot tell those references.

    No weak reference may remain either (a cache keyed weakly by the dropped tensor would
    otherwise find it alive with new contents).

    What the references cannot show is a ``Tensor.record_stream`` on the output: torch's
    allocator would keep a dropped tensor's memory from reuse until the other stream's work
    recorded on it has run, while a handed-out-again output is written by the plan's stream
    at once. So ``record_stream`` is watched (``_watch_streams``): once any tensor of the
    process is recorded on a stream, no output is handed out again (``RECYCLING``); nor by
    a plan built while torch.distributed is initialized (its collectives record their
    tensors' streams in C++, out of the watch's sight). ``KAIO_RECYCLE_OUTPUTS=0`` turns
    it off.

    When the last output is still referenced (a chain, ``h = add(h, r)``, passes it back in),
    it is kept for a later call and the one before it, dropped by then, is tried: a plan
    keeps at most two.

    ``made``: the output the recorded call made (None if unknown). Its ``tensor_check``
    tells "still what that call made" in one C call, where the thread is in the inference
    mode it was made in (``inf``, read once a call; the check also reads the dispatch state,
    so a tensor made in the other mode, or under autocast, fails it); the accessors one by
    one otherwise. ``SIG{j}`` then holds its signature (``tensor_check``'s ``outputs``),
    for a fast path that tells it in the same C call as the inputs' (``TOLD``, a local there;
    False in the replay)."""
    import torch

    size = math.prod(shape) * dtype.itemsize
    capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    try:
        capturing()  # a torch without CUDA has a stand-in that raises
    except Exception:  # noqa: BLE001 (no way to tell a capture: never hand out again)
        return None
    refs = _solo_refs()
    alone = _storage_alone(torch)
    if not (
        0 < size <= RECYCLE_BYTES
        and capturing
        and refs
        and alone
        and hasattr(torch.Tensor, "_use_count")
        and _watch_streams(torch)
        and not _distributed(torch)
    ):
        return None
    env.setdefault("CAPTURING", capturing)  # _never_captured on the legacy default stream
    env["REFS"], env["SOLO"] = sys.getrefcount, refs
    env["USES"], env["ALONE"], env["SOLE"] = alone
    env["INFERENCE"], env["WEAK"] = torch.is_inference_mode_enabled, weakref.getweakrefcount
    env["RECYCLING"] = RECYCLING
    env[f"KEPT{j}"], env[f"S{j}"], env[f"D{j}"] = [], torch.Size(shape), _arrays.torch_dtype(dtype)
    o = f"o{j}"
    unchanged = (
        f"{o}.shape == S{j} and {o}.is_contiguous() and {o}.dtype is D{j} "
        f"and not {o}.requires_grad and {o}.is_inference() is inf"
    )
    check = tensor_check([made]) if isinstance(made, torch.Tensor) else None
    if check is not None:
        env[f"OUT{j}"], env[f"MODE{j}"] = check, torch.is_inference_mode_enabled()
        env[f"SIG{j}"], env["TOLD"] = _signature(made), False
        unchanged = f"TOLD or (inf is MODE{j} and OUT{j}({o})) or ({unchanged})"
    same = (  # (nothing else refers to it: REFS told below)
        f"{o}._use_count() == 1 and USES(c{j}) == ALONE and REFS(s{j}) == SOLE "
        f"and {o}.data_ptr() == q{j} and ({unchanged}) and not WEAK({o}) and RECYCLING[0]"
    )
    kept = f"{o}, q{j}, s{j}, c{j}"  # the output, its address, its storage and that's address
    # the last output still referenced (a chain, h = add(h, r), passes it back in): kept
    # for a later call (``held{j}``, kept again after this one), the one before it tried
    take = [
        "try:",
        f"    {kept} = KEPT{j}.pop()",
        "except IndexError:",
        f"    {o} = None",
        f"held{j} = None",
        f"if {o} is not None and REFS({o}) != SOLO:",
        f"    held{j} = ({kept})",
        "    try:",
        f"        {kept} = KEPT{j}.pop()",
        "    except IndexError:",
        f"        {o} = None",
        "    else:",
        f"        if REFS({o}) != SOLO:  # referred to as well: the caller's now",
        f"            {o} = None",
    ]
    make = [
        f"if {o} is None or capturing or not ({same}):",
        f"    {o} = {fresh}",
        f"    q{j} = {o}.data_ptr()",
        f"    s{j} = {o}.untyped_storage()",
        f"    c{j} = s{j}._cdata",
    ]
    return take, make


def _signature(t) -> tuple:
    """(a tensor of ``t``'s type, dtype, device and dispatch keys holding no memory, ``t``'s
    shape, its strides): what ``tensor_check`` tells of ``t``, without keeping ``t``."""
    return t.new_empty(0), tuple(t.shape), t.stride()


def _watch_streams(torch) -> bool:
    """Watch ``torch.Tensor.record_stream`` (once a process): the first call, on any tensor,
    sets ``RECYCLING[0]`` to False before doing what it does. True when the watch is on."""
    original = torch.Tensor.record_stream
    if getattr(original, "_kaio_watch", False):
        return True

    @functools.wraps(original)
    def record_stream(self, stream):
        RECYCLING[0] = False  # the allocator now keeps memory for another stream's work
        return original(self, stream)

    record_stream._kaio_watch = True
    try:
        torch.Tensor.record_stream = record_stream
    except (AttributeError, TypeError):  # pragma: no cover - a torch that refuses it
        return False
    return True


def _distributed(torch) -> bool:
    """Whether torch.distributed is initialized (its NCCL collectives record streams in C++,
    which ``_watch_streams`` cannot see)."""
    dist = getattr(torch, "distributed", None)
    try:
        return bool(dist.is_available() and dist.is_initialized())
    except AttributeError:
        return False


def _raw_allocator():
    """(current device, allocate(bytes, stream) -> address, free(address)) of torch's CUDA
    caching allocator, called without making tensors; None where torch has no CUDA."""
    try:
        import torch
    except ImportError:
        return None
    c = torch._C
    names = ("_cuda_getDevice", "_cuda_cudaCachingAllocator_raw_alloc")
    if not all(hasattr(c, n) for n in (*names, "_cuda_cudaCachingAllocator_raw_delete")):
        return None
    return (
        c._cuda_getDevice,
        c._cuda_cudaCachingAllocator_raw_alloc,
        c._cuda_cudaCachingAllocator_raw_delete,
    )


def _replay(plan: CallPlan | None, inputs: int, allocations: list, returned: str) -> Callable:
    """Generate ``replay(p0, p1, ...)``: allocate the outputs, launch, return them. The plan's
    launches are inlined (``CallPlan.code``): one Python call from the op's wrapper to the
    driver.

    A torch array the op makes for its own kernels and does not return (a split-K
    workspace) is taken from torch's caching allocator directly, on the plan's stream, and
    given back once the launches are queued, as torch frees a tensor that goes out of scope:
    the next user of that memory on the stream runs after them (in a CUDA graph capture, the
    allocator serves the graph's own pool). That costs a fraction of a ``torch.empty``. It
    is done when torch's current device is the plan's, which the allocator serves;
    otherwise the workspace is a tensor like the outputs. A small workspace is the plan's
    own on the legacy default stream (``_owned_workspaces``: taken once, its address packed
    in the parameter buffers), else kept by the plan between its calls
    (``_held_workspaces``).

    Whether the stream is being captured into a CUDA graph (0.5 µs to ask torch) is asked
    only of a plan that launches on another stream than the legacy default one (stream 0,
    which CUDA never captures: ``cudaStreamBeginCapture`` refuses it)."""
    env: dict = {}
    params = [f"p{i}" for i in range(inputs)] + [f"a{i}=None" for i in range(inputs)]
    lines = [f"def replay({', '.join(params)}):"]
    if plan is not None and all(not prepared.stream for prepared, _ in plan.steps):
        env["CAPTURING"] = _never_captured
    kept = {int(n) for n in re.findall(r"\bo(\d+)\b", returned)}
    raw = _raw_allocator() if plan is not None else None
    scratch, tensors = [], []  # (j, bytes) from the allocator; (j, line) as tensors
    made_like = []  # (j, the input position) of outputs made with torch.empty_like
    recycled = []  # the outputs among those that a later call may hand out again
    takes = []  # the lines that take the outputs kept for them
    for j, (made, kind, device, like, shape, dtype, *twin) in enumerate(allocations):
        if kind == "torch":
            import torch

            env[f"A{j}"] = functools.partial(
                torch.empty,
                *shape,
                dtype=_arrays.torch_dtype(dtype),
                device=torch.device("cuda", device),
            )
            if twin and twin[0] is not None and EMPTY_LIKE:
                env["EMPTY_LIKE"] = torch.empty_like
                made_like.append((j, twin[0]))
            address = f"o{j}.data_ptr()"
            size = math.prod(shape) * dtype.itemsize
            if raw is not None and j not in kept and size > 0:
                scratch.append((j, size, device))
        else:
            env[f"A{j}"] = functools.partial(_arrays.new_array, kind, device, like, shape, dtype)
            address = f"o{j}.data.ptr" if kind == "cupy" else f"o{j}.ptr"
        fresh = f"A{j}()"
        if made_like and made_like[-1][0] == j:
            fresh = f"EMPTY_LIKE(a{made_like[-1][1]})"
        make = [f"o{j} = {fresh}"]
        # a returned output (like an input or not: matmul_tc's f32 of f16 inputs)
        again = None
        if kind == "torch" and j in kept:
            again = _recycled(env, j, fresh, shape, dtype, made)
        if again is not None:
            take, make = again
            takes += take
            address = f"q{j}"
            recycled.append(j)
        tensors.append((j, make + ([f"p{inputs + j} = {address}"] if plan else [])))
    owned = _owned_workspaces(env, scratch, raw)
    at_owned = list(zip(scratch, owned or [], strict=False))
    constants = {inputs + j: address for (j, _, _), address in at_owned}
    launches = plan.code(env, lambda source: f"p{source}", constants) if plan is not None else []
    if recycled:  # whether the stream is capturing, once; what this call made kept after it
        lines.append(f"    capturing = {_capture_test(env)}")
        lines.append("    inf = INFERENCE()")
        lines += ["    " + line for line in takes]
        launches = launches + [
            "    if not capturing:",
            *[
                line
                for j in recycled
                for line in (
                    f"        if held{j} is not None:",
                    f"            KEPT{j}.append(held{j})",
                    f"        KEPT{j}.append((o{j}, q{j}, s{j}, c{j}))",
                )
            ],  # fmt: skip
        ]
    taken = len(lines) - 1  # the body's lines up to the kept outputs taken
    held = None  # the workspaces kept between calls (_held_workspaces)
    if owned is not None:  # the plan's own, for good: constants packed in its buffers
        raw_js = {j for j, _, _ in scratch}
        lines += ["    " + line for j, made in tensors if j not in raw_js for line in made]
        code = "\n".join(launches)  # a tensor map over one is encoded by the calls: named
        lines += [f"    p{inputs + j} = {address}" for (j, _, _), address in at_owned
                  if re.search(rf"\bp{inputs + j}\b", code)]  # fmt: skip
        lines += launches
    elif scratch and len({device for _, _, device in scratch}) == 1:
        env["CURRENT"], env["ALLOCATE"], env["FREE"] = raw
        env["HOME"] = scratch[0][2]
        env["STREAM"] = plan.steps[0][0].stream or 0
        raw_js = {j for j, _, _ in scratch}
        lines += ["    " + line for j, made in tensors if j not in raw_js for line in made]
        lines.append("    if CURRENT() == HOME:  # the allocator serves the current device")
        held = _held_workspaces(env, scratch, inputs, recycled)
        if held is not None:
            lines += ["        " + line for line in held]
        else:
            lines += [f"        p{inputs + j} = ALLOCATE({size}, STREAM)" for j, size, _ in scratch]
        lines.append("        try:")
        lines += ["        " + line for line in launches]
        lines.append("        finally:")
        if held is not None:
            lines += [
                "            if capturing:",
                *[f"                FREE(p{inputs + j})" for j, _, _ in scratch],
                "            else:",
                "                HELD.append(ws)",
            ]
        else:
            lines += [f"            FREE(p{inputs + j})" for j, _, _ in scratch]
        lines.append("    else:")
        lines += ["        " + line for j, made in tensors if j in raw_js for line in made]
        lines += ["    " + line for line in launches]
    else:
        lines += ["    " + line for _, made in tensors for line in made]
        lines += launches
    lines.append(f"    return {returned}")
    replay = compile_function(lines, env, "replay", "<kaio op plan>")
    replay.plan = plan
    replay.body = lines[1:]  # the lines after the header, which _fast puts after its checks
    replay.taken = taken
    replay.outputs = _told_outputs(env, recycled)
    replay.owned = owned or []  # the addresses of the workspaces the plan owns
    if held is not None:  # the kept workspaces go back to the allocator with the plan
        weakref.finalize(replay, _give_back, env["HELD"], env["FREE"]).atexit = False
    if owned is not None:  # and the owned ones
        weakref.finalize(replay, _give_back, [owned], raw[2]).atexit = False
    return replay


def _told_outputs(env: dict, recycled: list) -> tuple | None:
    """(the inference mode, [(``o{j}``, ``SIG{j}``)]) of the outputs handed out again, when
    each has a signature (``_recycled``), all made in one mode: what a fast path tells with
    its inputs. None otherwise."""
    if not recycled or any(f"SIG{j}" not in env for j in recycled):
        return None
    modes = {env[f"MODE{j}"] for j in recycled}
    if len(modes) != 1:
        return None
    return modes.pop(), [(f"o{j}", env[f"SIG{j}"]) for j in recycled]


def _never_captured() -> bool:
    """The capture test of a plan on the legacy default stream, which is never captured."""
    return False


def _capture_test(env: dict) -> str:
    """The expression a replay asks whether its stream is being captured: ``False`` for a
    plan on the legacy default stream (``_replay``), else torch's ``CAPTURING()``."""
    return "False" if env["CAPTURING"] is _never_captured else "CAPTURING()"


def _give_back(kept: list, free: Callable) -> None:
    """Give the workspaces a dropped plan kept back to torch's caching allocator."""
    while kept:
        for address in kept.pop():
            free(address)


HELD_BYTES = 4 << 20  # the most workspace bytes a plan keeps between its calls


def _owned_workspaces(env: dict, scratch: list, raw) -> list | None:
    """The addresses of the workspaces (``scratch``: (j, bytes, device)) a plan owns for
    good, taken now from torch's caching allocator (``raw``) and given back with the plan:
    for a plan on the legacy default stream, whose kernels run in the order of their calls
    from any thread (one such stream a device) and are never captured into a graph, when
    they are small and the allocator serves the plan's GPU now. A call then pays nothing
    for them (a kept workspace, ``_held_workspaces``, costs a call about 0.3 µs). None
    otherwise."""
    if not scratch or raw is None or env.get("CAPTURING") is not _never_captured:
        return None
    devices = {device for _, _, device in scratch}
    if len(devices) != 1 or sum(size for _, size, _ in scratch) > HELD_BYTES:
        return None
    current, allocate, _free = raw
    try:
        if current() != devices.pop():
            return None
        return [allocate(size, 0) for _, size, _ in scratch]
    except Exception:  # noqa: BLE001 (a torch without CUDA: the calls take their own)
        return None


def _held_workspaces(env: dict, scratch: list, inputs: int, recycled: list) -> list | None:
    """The lines that take a plan's workspaces (``scratch``: (j, bytes, device)) for a call:
    the ones the plan keeps between its calls when no other call of it holds them (``HELD``,
    taken off and put back, so threads never share them) and the stream is not being
    captured (a capture takes its own from the graph's pool and gives them back after), else
    new ones from the caching allocator. Kept workspaces follow the plan's stream order as
    the allocator's blocks do, without the 0.8 µs of taking and giving back a block (one
    plan, one stream: its calls' kernels run one call after the other). None where the
    stream's capture cannot be told or the workspaces are large: every call then takes
    them from the allocator."""
    import torch

    capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    try:
        capturing()
    except Exception:  # noqa: BLE001 (a torch without CUDA: no way to tell a capture)
        return None
    if sum(size for _, size, _ in scratch) > HELD_BYTES:
        return None
    env.setdefault("CAPTURING", capturing)  # _never_captured on the legacy default stream
    env["HELD"] = []
    names = ", ".join(f"p{inputs + j}" for j, _, _ in scratch) + ","
    take = ", ".join(f"ALLOCATE({size}, STREAM)" for _, size, _ in scratch) + ","
    return [
        *([] if recycled else [f"capturing = {_capture_test(env)}"]),
        "try:",
        "    ws = HELD.pop()",
        "except IndexError:",
        "    ws = None",
        "if capturing and ws is not None:",
        "    HELD.append(ws)",
        "if capturing or ws is None:",
        f"    ws = ({take})",
        f"{names} = ws",
    ]


def tensor_check(tensors: list, outputs: list = ()) -> Callable | None:
    """``check(*tensors, *outputs)``: ``kaio.runtime.arguments.tensor_check`` of ``tensors``,
    then of each of ``outputs`` (signatures, ``_signature``) as the one in its place there."""
    return _tensor_check(
        [*tensors, *(like for like, _, _ in outputs)],
        [list(t.shape) for t in tensors] + [list(s) for _, s, _ in outputs],
        [list(t.stride()) for t in tensors] + [list(s) for _, _, s in outputs],
    )


def _fast(
    replay: Callable, names: list, positions: list, args: tuple, env: dict
) -> Callable | None:
    """``fast(<every parameter of the op, positionally>)``: ``replay`` for a call with the
    signature of ``args`` (a call that hit ``replay``'s plan with torch tensors, or None for
    an optional array, at ``positions`` of ``names``), MISS for any other call. It checks
    what the call's key would hold: every tensor at once (``tensor_check``: type, dtype,
    shape, strides, device; also its dispatch keys and ``requires_grad``, which the key does
    not hold, so it is stricter), the optional arrays given as None, each address's
    alignment, every other argument (by value and type), the stream, and that no recording
    or simulation is on; then runs the replay's own lines (its callers ask the op's
    ``when`` first). None where there is no ``tensor_check`` or the replay has no lines (or
    the first array is None). ``env``: the wrapper's namespace (RAW, recordings,
    SIMULATING)."""
    body = getattr(replay, "body", None)
    tensors = [args[i] for i in positions if args[i] is not None]
    first = args[positions[0]]
    check = tensor_check(tensors) if body is not None and first is not None else None
    if check is None:
        return None
    fenv = dict(replay.__globals__)  # the replay's own state (kept outputs, buffers) shared
    fenv.update(CHECK=check, REPLAY=replay, MISS=MISS, RAW=env["RAW"])
    fenv.update(recordings=env["recordings"], SIMULATING=env["SIMULATING"])
    checked = ", ".join(names[i] for i in positions if args[i] is not None)
    conditions = [f"{names[i]} is None" for i in positions if args[i] is None]
    for i, name in enumerate(names):
        if i not in positions:
            fenv[f"V{i}"], fenv[f"T{i}"] = args[i], type(args[i])
            conditions.append(f"{name} == V{i} and type({name}) is T{i}")
    device = first.get_device()
    if device >= 0:  # the stream the key holds: the first array's device's current one
        fenv["ON"], fenv["STREAM"] = device, env["RAW"](device)
        conditions.append("RAW(ON) == STREAM")
    told = _told_check(replay, tensors)
    lines = [f"def fast({', '.join(names)}):"]
    inputs = "" if told else f" or not CHECK({checked})"  # (told: after the outputs' taking)
    lines += [f"    if recordings[0] or SIMULATING[0]{inputs}:", "        return MISS"]
    if conditions:
        lines += [f"    if not ({' and '.join(conditions)}):", "        return MISS"]
    body = replay.body
    if told:  # the outputs kept for this call taken first, then told with the inputs
        fenv["MODE"], fenv["CHECKS"], outputs = told
        body, taken = body[replay.taken :], body[: replay.taken]
        present = " and ".join(f"{o} is not None" for o in outputs)
        lines += taken + [
            f"    if {present} and inf is MODE and CHECKS({checked}, {', '.join(outputs)}):",
            "        TOLD = True",
            f"    elif CHECK({checked}):",
            "        TOLD = False",
            "    else:",
            "        return MISS",
        ]
    addresses = []
    for j, i in enumerate(positions):
        value = "0" if args[i] is None else f"{names[i]}.data_ptr()"
        lines.append(f"    p{j} = {value}")
        if args[i] is not None:
            addresses.append((f"p{j}", args[i].data_ptr() & 15))
    if all(rest == 0 for _, rest in addresses):  # the common case: every array 16-byte aligned
        misaligned = f"({' | '.join(p for p, _ in addresses)}) & 15"
    else:
        misaligned = " or ".join(f"{p} & 15 != {rest}" for p, rest in addresses)
    lines += [f"    if {misaligned}:", "        return MISS"]
    source = "\n".join(replay.body)
    lines += [f"    a{j} = {names[i]}" for j, i in enumerate(positions)
              if re.search(rf"\ba{j}\b", source)]  # fmt: skip
    return compile_function(lines + body, fenv, "fast", "<kaio op plan, fast path>")


def _told_check(replay: Callable, tensors: list) -> tuple | None:
    """(the mode, ``tensor_check`` of ``tensors`` then the outputs ``replay`` hands out
    again, their names) when the thread is in the inference mode those outputs were made
    in: a fast path tells the outputs kept for a call in the same C call as its inputs (one
    call less a call, each output's ``OUT{j}`` taken only where that fails). None
    otherwise."""
    import torch

    outputs = getattr(replay, "outputs", None)
    if outputs is None or outputs[0] is not torch.is_inference_mode_enabled():
        return None
    mode, signatures = outputs
    check = tensor_check(tensors, [signature for _, signature in signatures])
    return None if check is None else (mode, check, [o for o, _ in signatures])


def planned(*array_names: str, when: Callable[[], bool] | None = None) -> Callable:
    """Decorator: call plans for an op whose array parameters are ``array_names`` (the
    others are keyed by value). The wrapper has the op's name, signature and docstring.
    ``when``: a function asked at each call whether plans serve it; when it says no, the
    op runs as written (for a choice the op makes at plan time that tests and plan
    searches replace: matmul_fp8's tile choice, ``_fp8_hopper.config``)."""

    def wrap(fn: Callable) -> Callable:
        return _generate(fn, array_names, when)

    return wrap


def _generate(fn: Callable, array_names: tuple, when: Callable | None = None) -> Callable:
    signature = inspect.signature(fn)
    names = list(signature.parameters)
    for name, p in signature.parameters.items():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(
                f"{fn.__name__}: planned ops take plain or keyword-only parameters, not {name!r}"
            )
    named = [n for n, p in signature.parameters.items() if p.kind is p.KEYWORD_ONLY]
    first = len(names) - len(named)
    missing = [a for a in array_names if a not in names]
    if missing:
        raise TypeError(f"{fn.__name__}: no parameter named {missing}")
    tensor, raw_stream = _torch(imported_only=True)
    parameter = getattr(sys.modules.get("torch.nn"), "Parameter", tensor)
    plans: dict = {}
    _ALL.append(plans)
    positions = [names.index(a) for a in array_names]
    optional = {a for a in array_names if signature.parameters[a].default is None}

    def slow(key, args: tuple, pointers: tuple):
        """A call with no plan for its key: run the op, recording a plan when it can."""
        arrays = [args[i] for i in positions]
        present = [a for a in arrays if a is not None]
        if len({id(a) for a in present}) != len(present):  # one array passed twice
            twins = _twins(args, positions)
            if twins is not None and not current.simulating:
                args = twins
                arrays = [args[i] for i in positions]
                present = [a for a in arrays if a is not None]
        # the flat key of torch tensors (see below) describes them all; in the other keys a
        # None stands for an array that is not described
        flat = all(
            type(a) is env["T"] or type(a) is env["P"] or (a is None and name in optional)
            for a, name in zip(arrays, array_names, strict=True)
        )
        plannable = (
            not current.simulating
            and current.recorder is None  # an op inside another op's recording
            and (flat or None not in key[: len(arrays)])
            and len({id(a) for a in present}) == len(present)
        )
        kwargs = dict(zip(named, args[first:], strict=True))
        if not plannable:
            return fn(*args[:first], **kwargs)
        with recording() as recorder:
            result = fn(*args[:first], **kwargs)
        replay = build(recorder, arrays, pointers, result)
        if len(plans) >= MAX_PLANS:
            plans.clear()
        try:
            plans[key] = replay
        except TypeError:  # an unhashable argument: no plan
            pass
        return result

    env = {"T": tensor, "P": parameter, "RAW": raw_stream, "other": describe}
    if tensor is _NoTorch:
        _UNBOUND.append(env)
    env["stream_key"] = lambda obj, raw: stream_key(obj, raw)  # looked up per call: patchable
    env.update(current=current, plans=plans, slow=slow, fn=fn, WHEN=when)
    # the fast path (_fast): FAST[0], the function of the plan hit by the last two calls in
    # a row (None: off), LAST[0] the plan the last call hit
    fast, last = [None], [None]
    _CELLS.append((fast, last))

    def arm(replay, args: tuple):
        """The fast path of ``replay`` for calls like ``args``, made once per plan and
        inference mode; None where it has none (and the count of hits starts again)."""
        import torch

        fasts = replay.__dict__.setdefault("fasts", {})
        mode = torch.is_inference_mode_enabled()
        if mode not in fasts:
            fasts[mode] = _fast(replay, names, positions, args, env)
        if fasts[mode] is None:
            last[0] = None
        return fasts[mode]

    env.update(FAST=fast, LAST=last, ARM=arm)
    header = []
    for i, name in enumerate(names):
        default = signature.parameters[name].default
        if default is inspect.Parameter.empty:
            header.append(name)
        else:
            env[f"D{i}"] = default
            header.append(f"{name}=D{i}")
    # the wrapper keeps the op's keyword-only parameters; replay_only takes every parameter
    # positionally, in signature order, as the torch dispatcher passes them
    wrapper_header = header[:first] + (["*"] if named else []) + header[first:]
    all_args = ", ".join(names)
    # a call of the plan the last two calls hit: its fast path, which checks the call's
    # signature in one C call and replays; a call it does not serve turns it off until two
    # calls in a row hit one plan again (calls that take turns between plans pay nothing
    # for it; calls of one plan that its check refuses, a third of a failed check each)
    prologue = [
        "quick = FAST[0]",
        "if quick is not None:",
        f"    got = quick({all_args})",
        "    if got is not MISS:",
        "        return got",
        "    FAST[0] = LAST[0] = None",
    ]
    # after a hit: arm the fast path when the last call hit the same plan (torch calls)
    arming = [
        "if replay is not LAST[0]:",
        "    LAST[0] = replay",
        "elif flat:",
        f"    FAST[0] = ARM(replay, ({all_args},))",
    ]
    lines = [f"def {fn.__name__}({', '.join(wrapper_header)}):", "    try:"]
    # the common call, torch tensors (or None for an optional array) only: one flat key of
    # torch's own accessors (no tuple per array); contiguity stands for the strides, which a
    # contiguous tensor's kernels never see (ops refuse other tensors, unplanned)
    tensors = [f"(type({a}) is T or type({a}) is P)" for a in array_names]
    tensors = [f"({a} is None or {t})" if a in optional else t
               for a, t in zip(array_names, tensors, strict=True)]  # fmt: skip
    fast_keys = []
    fast_lines = [f"    if {' and '.join(tensors)}:"]
    for j, a in enumerate(array_names):
        device = "d" if j == 0 else f"{a}.get_device()"
        if j == 0:
            fast_lines += [f"        d = {a}.get_device()", "        flat = True"]
        described = (
            f"{a}.dtype, {a}.shape, {a}.is_contiguous() or {a}.stride(), {device}, p{j} & 15"
        )
        if a in optional:
            fast_lines.append(f"        p{j} = 0 if {a} is None else {a}.data_ptr()")
            fast_keys.append(f"None if {a} is None else ({described})")
        else:
            fast_lines.append(f"        p{j} = {a}.data_ptr()")
            fast_keys.append(described)
    describe_lines = []
    for j, name in enumerate(array_names):
        if j == 0:
            describe_lines += [
                f"    if type({name}) is T or type({name}) is P:",
                f"        d = {name}.get_device()",
                f"        p{j} = {name}.data_ptr()",
                f"        k{j} = ({name}.dtype, {name}.shape, {name}.stride(), d, p{j} & 15)",
                "        stream = RAW(d) if d >= 0 else None",
                "    else:",
                f"        k{j}, p{j} = other({name})",
                f"        stream = stream_key({name}, RAW)",
                "    flat = False",
            ]
        else:
            describe_lines += [
                f"    if type({name}) is T or type({name}) is P:",
                f"        p{j} = {name}.data_ptr()",
                f"        k{j} = ({name}.dtype, {name}.shape, {name}.stride(), "
                f"{name}.get_device(), p{j} & 15)",
                "    else:",
                f"        k{j}, p{j} = other({name})",
            ]
    others = [n for n in names if n not in array_names]
    # a value and its type: 2 and 2.0, or True and 1, may take different checks
    keys = [f"k{j}" for j in range(len(array_names))] + [f"{n}, type({n})" for n in others]
    pointers = ", ".join(f"p{j}" for j in range(len(array_names)))
    arrays_args = ", ".join(array_names)
    call_args = ", ".join(names[:first] + [f"{n}={n}" for n in named])
    # simulate() blocks: the thread's count, read only while a block is open somewhere
    simulating = "(SIMULATING[0] and current.simulating)"
    describe_lines.append(f"    key = ({', '.join(keys)}, stream, {simulating})")
    stream = "RAW(d) if d >= 0 else None"
    fast_keys += [f"{n}, type({n})" for n in others] + [stream, simulating]
    fast_lines.append(f"        key = ({', '.join(fast_keys)})")
    lines += ["    " + line for line in [*fast_lines, "    else:"]]
    lines += ["        " + line for line in describe_lines]
    body = lines[1:]
    # planned(when=...): no plans while it says no (the fast path's plans included)
    unplanned = ["    if not WHEN():", f"        return fn({call_args})"] if when else []
    lines[1:1] = unplanned + ["    " + line for line in prologue]
    lines += [
        "    except Exception:  # not an array these keys describe (a meta tensor, say)",
        f"        return fn({call_args})",
        "    if recordings[0]:  # maybe inside another op's recording: its launches must show",
        f"        return slow(key, ({all_args},), ({pointers},))",
        "    try:",
        "        replay = plans[key]",
        "    except (KeyError, TypeError):",
        f"        return slow(key, ({all_args},), ({pointers},))",
        "    if replay is None:",
        f"        return fn({call_args})",
        *["    " + line for line in arming],
        f"    return replay({pointers}, {arrays_args})",
    ]
    # replay_only: the same lookup, MISS instead of running the op (kaio_ops.torch's impl)
    lines += [f"def replay_only({', '.join(header)}):"]
    lines += ["    if not WHEN():", "        return MISS"] if when is not None else []
    lines += ["    " + line for line in prologue]
    lines += body
    lines += [
        "    except Exception:",
        "        return MISS",
        "    replay = plans.get(key)",
        "    if replay is None or recordings[0]:",
        "        return MISS",
        *["    " + line for line in arming],
        f"    return replay({pointers}, {arrays_args})",
    ]
    # dispatch_entry(fallback): replay_only with the miss handled inside (``fallback`` called
    # with every argument, positionally), for torch.ops.kaio: one Python call to the launch
    lines += ["def dispatch_entry(FALLBACK):", f"    def {fn.__name__}({', '.join(header)}):"]
    if when is not None:
        lines += ["        if not WHEN():", f"            return FALLBACK({all_args})"]
    lines += ["        " + line for line in prologue]
    lines += ["    " + line for line in body]
    lines += [
        "        except Exception:",
        f"            return FALLBACK({all_args})",
        "        replay = plans.get(key)",
        "        if replay is None or recordings[0]:",
        f"            return FALLBACK({all_args})",
        *["        " + line for line in arming],
        f"        return replay({pointers}, {arrays_args})",
        f"    return {fn.__name__}",
    ]
    env["MISS"] = MISS
    env["recordings"] = recordings
    env["SIMULATING"] = sim.anywhere
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<kaio planned {fn.__name__}>", "exec"), env)
    wrapper = env[fn.__name__]
    functools.update_wrapper(wrapper, fn)
    wrapper._plans = plans
    wrapper.replay_only = env["replay_only"]
    wrapper.dispatch_entry = env["dispatch_entry"]
    wrapper.source = source
    return wrapper
