"""The launch limits every GPU kaio targets (sm_70 and newer) enforces, checked before a launch
on the GPU and in the simulator alike, so that nothing the driver or ptxas refuses runs in the
simulator.

- ``check_dims``: block dimensions (x, y <= 1024, z <= 64, at most 1024 threads) and grid
  dimensions (x < 2^31, y, z <= 65535); called when a launch subscript is parsed, once per
  subscript (``kaio.kernel.parse_launch_config``).
- ``STATIC_SHARED_LIMIT``: 48 KB of static ``kaio.shared`` memory per block (ptxas' limit),
  checked when a kernel is compiled (a ``CompileError`` at the ``kaio.shared`` call that
  crosses it).
- ``check_dynamic_shared``: static plus dynamic shared memory within the per-block opt-in limit
  of the arch (``SHARED_OPTIN_LIMIT``; on a GPU the device's own attribute is used instead).
"""

from __future__ import annotations

from kaio.errors import LaunchError

MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID_DIM = (2**31 - 1, 65535, 65535)
STATIC_SHARED_LIMIT = 48 * 1024

# cudaDevAttrMaxSharedMemoryPerBlockOptin by compute capability (CUDA C Programming Guide,
# "Technical Specifications per Compute Capability"): static + dynamic shared bytes of a block.
SHARED_OPTIN_LIMIT = {
    70: 96 * 1024,
    72: 96 * 1024,
    75: 64 * 1024,
    80: 163 * 1024,
    86: 99 * 1024,
    87: 163 * 1024,
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    101: 227 * 1024,
    103: 227 * 1024,
    120: 99 * 1024,
}


def static_shared_bytes(function) -> list[tuple[str, int]]:
    """``(array name, bytes)`` of each static shared array of an IR function (or of anything
    with its ``arrays``, such as the frontend while lowering), each padded to its 16-byte
    alignment as the emitter declares it."""
    return [
        (a.name, -(-a.static_size * a.dtype.itemsize // 16) * 16)
        for a in function.arrays
        if a.space == "shared"
    ]


def check_dims(name: str, grid: tuple, block: tuple) -> None:
    """Refuse a block or grid (3-tuples) over the limits every supported GPU has."""
    threads = block[0] * block[1] * block[2]
    for axis, n, top in zip("xyz", block, MAX_BLOCK_DIM, strict=True):
        if n > top:
            raise LaunchError(
                f"{name}: block {block} has {n} threads in {axis}; a block has at most "
                f"{top} in {axis} (max block {MAX_BLOCK_DIM}, {MAX_THREADS_PER_BLOCK} threads)"
            )
    if threads > MAX_THREADS_PER_BLOCK:
        raise LaunchError(
            f"{name}: block {block} has {threads} threads; a block has at most "
            f"{MAX_THREADS_PER_BLOCK}: use a smaller block and more blocks"
        )
    for axis, n, top in zip("xyz", grid, MAX_GRID_DIM, strict=True):
        if n > top:
            raise LaunchError(
                f"{name}: grid {grid} has {n} blocks in {axis}; a grid has at most {top} in "
                f"{axis} (max grid {MAX_GRID_DIM}): put more work in each block, or move "
                "blocks to another axis"
            )


def shared_optin_limit(arch: str) -> int:
    """The static + dynamic shared bytes a block of ``arch`` (``"sm_90"``) may use after opting
    in; an arch not in the table takes the nearest older one's."""
    digits = "".join(c for c in arch.removeprefix("sm_") if c.isdigit())
    number = int(digits) if digits else 90
    known = [cc for cc in SHARED_OPTIN_LIMIT if cc <= number]
    return SHARED_OPTIN_LIMIT[max(known)] if known else SHARED_OPTIN_LIMIT[70]


def check_dynamic_shared(name: str, dynamic: int, static: int, arch: str) -> None:
    """Refuse ``dynamic`` bytes of dynamic shared memory when, with ``static`` bytes of static
    shared memory, they are over ``arch``'s opt-in limit."""
    limit = shared_optin_limit(arch)
    if static + dynamic > limit:
        raise LaunchError(
            f"{name}: {dynamic} bytes of dynamic shared memory (+ {static} static) is over the "
            f"{limit} bytes a block may use on {arch}; use smaller tiles"
        )
