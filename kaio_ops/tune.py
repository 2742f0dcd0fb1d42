"""The matmul autotuner: time every candidate plan on the GPU, keep the fastest.

``kaio_ops.tune.matmul(a, b)`` runs each candidate tile configuration (and, for skinny
shapes, each K split) on the caller's arrays, times it with CUDA events, and stores the
fastest in ``$KAIO_CACHE_DIR/tune.json`` under the GPU's name, the variant and the shape
bucket (M, N, K rounded up to powers of two). From then on the matmul ops use it for every
shape in that bucket, in this process and the next; without an entry they use the
heuristic (``kaio_ops.matmul.heuristic``). The simulator never reads the file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings

import kaio
from kaio.runtime import cache_dir
from kaio.sim import active as simulating
from kaio.types import bf16, f16

__all__ = ["bucket", "lookup", "matmul", "path"]

_table: dict | None = None


def path() -> str:
    """Where tuned plans are stored."""
    return os.path.join(cache_dir(), "tune.json")


def bucket(m: int, n: int, k: int) -> str:
    """The shape bucket: each dimension rounded up to a power of two (M at least 16)."""
    return "x".join(str(1 << max(0, math.ceil(math.log2(v)))) for v in (max(m, 16), n, k))


def _key(device: kaio.Device, variant: str, m: int, n: int, k: int) -> str:
    return f"{device.name}|{variant}|{bucket(m, n, k)}"


MAX_SPLIT = 64


def _load() -> dict:
    global _table
    if _table is None:
        try:
            with open(path()) as f:
                table = json.load(f)
        except (OSError, ValueError, RecursionError):
            table = {}
        _table = valid_entries(table, path())
    return _table


def valid_entries(table, where: str) -> dict:
    """The entries of a loaded tune table that name a known configuration and a K split
    of 1 to ``MAX_SPLIT``: ``{"GPU|variant|bucket": {"config": str, "split": int}}``. Anything
    else (a table of the wrong shape, an unknown configuration, a split of 0) is left out,
    with one warning naming the file: a bad entry never fails a matmul."""
    from kaio_ops.matmul import CONFIGS

    good, bad = {}, 0
    if not isinstance(table, dict):
        table, bad = {}, 1
    for key, entry in table.items():
        split = entry.get("split", 1) if isinstance(entry, dict) else None
        if (
            isinstance(key, str)
            and isinstance(entry, dict)
            and isinstance(entry.get("config"), str)
            and entry["config"] in CONFIGS
            and type(split) is int
            and 1 <= split <= MAX_SPLIT
        ):
            good[key] = {"config": entry["config"], "split": split}
        else:
            bad += 1
    if bad:
        warnings.warn(
            f"kaio_ops.tune: ignoring {bad} malformed entr{'y' if bad == 1 else 'ies'} of "
            f'{where} (each must be {{"config": one of {", ".join(CONFIGS)}, "split": '
            f"1 to {MAX_SPLIT}}}); the matmul ops use the heuristic for those shapes. Delete the "
            "file or run kaio_ops.tune.matmul again to rewrite it",
            stacklevel=4,
        )
    return good


def _save(table: dict) -> None:
    os.makedirs(os.path.dirname(path()), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path()), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    os.replace(tmp, path())  # atomic: a concurrent reader sees the old or the new file


def lookup(like, variant: str, m: int, n: int, k: int):
    """The stored plan for the GPU of ``like`` (an ``Operand``), ``variant``
    (``"f16_async"``...) and this shape's bucket, or None (always in the simulator)."""
    from kaio_ops import _arrays
    from kaio_ops.matmul import CONFIGS, Plan

    dev = _arrays.gpu(like)
    if dev is None:
        return None
    entry = _load().get(_key(dev, variant, m, n, k))  # validated: valid_entries
    if entry is None or entry["config"] not in CONFIGS:
        return None
    return Plan(entry["config"], entry["split"])


def candidates(m: int, n: int, k: int) -> list:
    """The plans worth timing for an ``m x n x k`` product."""
    from kaio_ops.matmul import CONFIGS, SKINNY, SKINNY_M, Plan

    if m <= SKINNY_M:
        return [Plan(SKINNY, s) for s in (1, 2, 4, 8, 16) if k >= s * CONFIGS[SKINNY].bk]
    return [Plan(name) for name in CONFIGS if name != SKINNY]


def _time(fn, repeats: int, stream) -> float:
    fn()
    fn()
    start, end = kaio.Event(), kaio.Event()
    start.record(stream)
    for _ in range(repeats):
        fn()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / repeats


def matmul(a, b, pipelined: bool = True, repeats: int = 20) -> dict:
    """Time every candidate plan for ``a @ b`` (f16 or bf16 by ``a``'s dtype), store the
    fastest for this GPU and shape bucket, and return ``{plan: milliseconds}``."""
    from kaio_ops import _arrays
    from kaio_ops.matmul import _check, run

    if simulating() or not kaio.gpu_available():
        raise RuntimeError("kaio_ops.tune.matmul times kernels on a GPU; none is available")
    dtype = _arrays.Inputs("tune.matmul").array(a, "a", ndim=2, dtypes=(f16, bf16)).dtype
    oa, ob = _check("tune.matmul", a, b, dtype)
    m, k = oa.shape
    n = ob.shape[1]
    stream = _arrays.stream_of(oa)
    dev = _arrays.gpu(oa)
    with dev:  # the timing events on the arrays' GPU
        times = {
            plan: _time(lambda p=plan: run(a, b, dtype, pipelined, p), repeats, stream)
            for plan in candidates(m, n, k)
        }
    best = min(times, key=times.get)
    variant = f"{dtype.name}_{'async' if pipelined else 'sync'}"
    table = _load()
    table[_key(dev, variant, m, n, k)] = {"config": best.config, "split": best.split}
    _save(table)
    return times
