"""The W4A16 decode kernel: ``out [M, N] (f32) = x [M, K] (f16) @ W`` for M <= 64, with the
int4 weights read from global memory straight into ``mma`` fragments.

At decode shapes the weights are the traffic (K N / 2 bytes) and the product is a sliver of
the tensor cores' rate, so the kernel is built around the weight stream:

- A block owns 32 output columns; its ``WARPS`` warps split K by scale groups (128 values,
  16 packed rows: group ``w``, ``w + WARPS``, ... for warp ``w``) and add their partial tiles
  in shared memory at the end, in a fixed order (results do not vary run to run).
- Lane ``(g, t)`` (``g = lane // 4``, ``t = lane % 4``) loads 16 bytes of weights: packed row
  ``4 u + t`` of a group, columns ``4 g .. 4 g + 3``. A warp's load is four 128-byte rows,
  and no thread waits for another's bytes: there is no shared-memory staging.
- The k order inside one ``mma.sync`` m16n8k16 is free as long as A and B agree. Lane
  ``(g, t)`` holds one word per column, nibbles ``k0 .. k0 + 7`` with ``k0 = 8 (4 u + t)``;
  its B registers must hold column ``g`` of an n8 tile, rows ``2 t + 8 r`` and ``+ 1``. So
  column ``4 g + i`` of the block goes to n8 tile ``i``, column ``g``; and logical rows
  ``2 t + 8 r``, ``+ 1`` of k-step ``h`` are nibbles ``j = 2 h + r`` and ``j + 4`` of the
  word: the pair ``(w >> 4 j) & 0x000F000F`` picks in one step. The A fragment takes the
  same permutation: elements ``j`` and ``j + 4`` of the lane's own 8 values of x (one 16-byte
  load per row), paired by ``prmt``.
- At M <= 8 (``SWAP``, ``multiply_swapped``) the roles turn: the weights are the A operand
  (m16: the lane's columns ``4 g + 2 p`` and ``+ 1`` as rows g and g + 8 of tile p, the same
  dequantized pairs), x the B operand (n8: x's rows, the same ``prmt`` pairs), so one
  m16n8k16 takes 256 weights instead of 128 and no A rows are zero: half the ``mma``
  instructions. The warps of a small grid (8192 x 8192 fills the SMs with 16 warps each)
  are busy issuing, so fewer instructions a weight is time saved (docs/performance.md).
- At M = 9-16 the roles turn too where ``plan`` says (``SWAP`` 2): x's two 8-row slabs are
  two n8 tiles of B, one ``mma`` each per weight fragment. There the weight pairs are a
  byte's two nibbles (``DEQ`` 6: the byte put in both halves by one ``prmt``, then the
  same ``lop3``): k ``2 j``, ``2 j + 1`` of the lane's 8 values, which are the halves of
  x's registers as loaded, so x needs no ``prmt`` and its B registers are two adjacent
  registers of one load.
- x's fragments can be loaded ``XLEAD`` loads ahead into a ring of XLEAD + 1 slots instead
  of with the words (two whole groups of x in registers): 124 registers instead of 149 at
  M = 16 (16 warps an SM instead of 12), 93 instead of 110 at M <= 8.
- Past 16 rows a block holds ceil(M / 16) m16 tiles (``ROWS``, the 8-row slabs of x: 1, 2,
  then 4, 6, 8): each weight fragment is dequantized once and feeds one ``mma`` per tile, so
  the weights are read once per call whatever M. x's fragments of those tiles are loaded
  where they are used (L2-resident, shared by every block): double-buffering them too would
  take 32 registers per 8 rows. 8 tiles (M <= 128) spill on sm_90, hence ``MAX_M = 64``.
  What grows with M is x's traffic from L2: each of the N / 32 blocks reads all of x
  (2 M K bytes, M / 8 times the words' bytes), about 8x the weights at M = 64.
- Nibble to f16 by the magic number: ``pair ^ 0x64086408`` is ``1024 + 8 + q`` in each half,
  exact; minus 1032 gives ``q``, times the group's scale gives ``f16(scale * q)`` rounded
  once, the weight of the op's contract. The mask and the xor are one ``lop3`` (``DEQ`` 5:
  a shift, a lop3, a subtraction and a product a pair of weights, 4 instructions, not 5).

- ``ASYNC``: the words and scales go global -> shared by ``cp.async`` into rings of WBUF
  slots (``stage_group``: a warp's lanes copy contiguous 16-byte chunks, whole sectors;
  ``swizzled`` in shared memory so copies and reads hit 8 bank groups), and each turn reads
  its slot back (``read_stage``) after ``cp_async_wait`` and ``sync_warp``: no register
  holds a group in flight (72-76 registers at M <= 8 instead of 96-110; x then comes 3
  loads ahead).
- ``XS`` (M <= 16, sm_90): x goes global -> shared by ``cp.async`` too, into a ring of WBUF
  slots a K slice (the ``CS`` warps of a block that take the same scale groups, one per
  column block): each group's x is copied once for the slice's CS column blocks, so x's
  traffic from L2 is divided by CS. The slice's threads meet at an mbarrier a turn
  (``x_turn``), which also frees the slot the previous turn read; rows padded to 320 bytes
  keep the reads (``ld.shared.v4``) free of bank conflicts, each thread's places in the ring
  computed once (``x_bases``).
- ``TAIL`` (not a constexpr: ``matmul``'s, M <= 16): where the blocks make a few whole
  rounds of one block an SM and a partial one, the partial round's blocks are split over K
  in TAIL parts (``tail_whole``; ``SPLIT`` blocks from ``whole`` on, the last part to
  arrive adding the parts in order: deterministic), so that the SMs that would hold a
  block more hold a part more.
- ``XC`` and ``WC``: the cache operators of x's and the words' loads (``LOAD_CACHES``).
  At M = 9-16 x by the read-only path (``ld.global.nc``, XC 3) and the words not allocated
  in L1 (``ld.global.L1::no_allocate``, WC 6) took 3-8% off (``LOADS_16``); ``.cg`` for the
  words (WC 1) did not.
- ``PDL`` (not a knob of ``TUNED``: ``matmul``'s, sm_90): programmatic dependent launch. The
  kernel is placed and set up while the kernel before it ends and waits for it
  (``grid_dependency_wait``) before any global load or store (``await_previous``: PDL 1);
  PDL 3 first lets the kernel after it be placed (``launch_dependents``) and asks L2 for
  each warp's first groups of words (a prefetch reads nothing the kernel before may still
  write). Routed at M = 9-16: 3, 1 on the plans with a K split (the next kernel's blocks,
  placed early, crowd the multiprocessors its split halves leave first); launch_dependents
  without the prefetches and PDL 3 with the blocks an SM held to the grid's share by
  padded shared memory were measured no better and deleted (docs/performance.md,
  "W4A16 decode, M 9-16, tenth pass"). PDL 4 lets the next kernel launch only after each
  block's main loop (``launch_dependents`` before the warps' sums): routed on the blocks of
  3 at M = 9-16; it lost on the plans with a K split at M = 9-16, and so did PDL 3 there,
  but ``LOADS_8`` (M <= 8, with the halves) takes PDL 3; PDL 4 with PDL 3's prefetches was
  no faster anywhere and deleted ("W4A16 decode, twelfth pass").

``plan`` picks the warps a block and these knobs by M and the tiles an SM (measured on an
H100). The other knobs of ``TUNED`` (an L2 prefetch of later groups, the words' L2 fetch
size, a dequantization by one lop3 a pair and an exact fma for the pairs at bit 4 (DEQ 1,
the same bits), launch bounds, a K split over blocks, three register buffers of words
(``WBUF``), blocks of several 32-column blocks whose warps share x through L1 (``CS``),
the words loaded ``.cg`` so that L1 keeps x (``WC`` 1); DEQ 2-4 are ablations with wrong
results) were measured slower or equal and stay off; the benchmark sets them
(``bench/int4_decode.py --variants``, ``--plan-tunes``).

Needs N % 4 == 0 and K % 128 == 0, x 16-byte aligned, the words 16-byte and the scales
8-byte aligned (``matmul_int4`` checks and otherwise takes the tiled kernel).
"""

# ruff: noqa: F821  (DT in annotations is a dtype constexpr parameter)
from __future__ import annotations

import kaio
from kaio import f16, f16x2, f32, i32, u32, u64
from kaio_ops import _arrays

COLS = 32  # output columns per block: 8 lane groups x 4 adjacent columns
ROWS_PER_GROUP = 16  # packed word rows per scale group (128 values)
LOADS = ROWS_PER_GROUP // 4  # 16-byte loads per lane and group
# XS: a row of a group's x in its ring, 128 halves padded to 160 (320 bytes: rows g and g + 1
# of a read phase fall on the two halves of the banks), and a slot of 16 rows
XPITCH = 160
XSLOT = 16 * XPITCH
# the loads' cache operators and L1 eviction priorities (kaio.load_vector's cache) by knob value
LOAD_CACHES = ("", "cg", "cs", "nc", "L1::evict_last", "L1::evict_first", "L1::no_allocate")
PAIR_MASK = 0x000F000F  # nibbles j and j + 4 of a word shifted right by 4 j
# XORed into a masked pair: the exponent of f16 1024 in each half, and the nibble's sign bit
# flipped (q + 8); read as an f16 pair, the same bits are 1032 = 1024 + 8, subtracted after.
MAGIC = 0x64086408
MAGIC_HIGH = 0x64806480  # the same for a nibble at bit 4: 1024 + 16 (q + 8)
BYTE_MASK = 0x00F0000F  # DEQ 6: a byte's low nibble in the low half, its high one at bit 20
# DEQ 6's magic number: f16 1024 (low half) and 64 (high half, whose ulp 1/16 makes the nibble
# at bit 20 count 1 each), each nibble's sign bit flipped; read as an f16 pair, 1032 and 72
MAGIC_BYTE = 0x54806408
SIXTEENTH = 0x2C002C00  # f16 1/16 in both halves
MINUS_72 = 0xD480D480  # f16 -72 = -(64 + 8) in both halves
LUT_AND_XOR = (0xF0 & 0xCC) ^ 0xAA  # lop3's (a & b) ^ c
LOW_HALVES = 0x5410  # prmt selectors: the low 16 bits of a, then of b
HIGH_HALVES = 0x7632  # the high 16 bits of a, then of b
LOW_TWICE = 0x1010  # the low 16 bits of a in both halves
HIGH_TWICE = 0x3232  # the high 16 bits of a in both halves


@kaio.gpu_func
def load_group(
    words: u32[:, :, :], xr: u32[:, :, :, :], sc: u32[:, :], BUF: kaio.constexpr, w: u32[:, :],
    x: f16[:, :], scales: f16[:, :], group: u32, col: u32, g: u32, t: u32, M: u32,
    ROWS: kaio.constexpr, L2F: kaio.constexpr, XLEAD: kaio.constexpr, WC: kaio.constexpr,
    XS: kaio.constexpr, XC: kaio.constexpr,
):  # fmt: skip
    """Buffer BUF = scale group ``group``'s operands of this lane: its 4 columns' scales (sc),
    the words of packed rows ``16 group + 4 u + t`` (words[u]) and, when ``ROWS`` <= 2 (one
    m16 tile) and ``XLEAD`` and ``XS`` are 0, the 8 halves of x those words multiply, rows g
    and g + 8 (xr[u, r]; rows past M read row M - 1 instead: their products land in rows that
    are never stored). Past one tile the x fragments are loaded where they are used
    (``multiply_group``): buffering them all would take 32 registers per 8 rows; with
    ``XLEAD`` they are loaded ``XLEAD`` loads ahead (``load_x``), with ``XS`` read from
    shared memory (``step_x``). ``WC`` the words' cache
    operator: 0 the default, 1 ``.cg`` (L2 only: L1 keeps x, which every block reads), 2
    ``.cs`` (streaming)."""
    kaio.load_vector(sc[BUF], scales, (group, col))
    for u in kaio.static_range(LOADS):
        row = group * ROWS_PER_GROUP + 4 * u + t
        kaio.load_vector(words[BUF, u], w, (row, col), L2F, LOAD_CACHES[WC])
        if ROWS <= 2 and XLEAD == 0 and XS == 0:
            for r in kaio.static_range(ROWS):
                at = (kaio.min(g + 8 * r, M - 1), 8 * row)
                kaio.load_vector(xr[BUF, u, r], x, at, 0, LOAD_CACHES[XC])


@kaio.gpu_func
def swizzled(t: u32, g: u32) -> u32:
    """ASYNC: the 16-byte slot, in a warp's 512 bytes of one load, of packed row ``t``'s
    column chunk ``g`` (row t at 128 t, chunk ``(g + 2 t) % 8``): the 8 lanes of a copy phase
    (one row) and of a read phase (lanes ``(g, t)``: 2 chunks of 4 rows) hit 8 different
    bank groups."""
    return 8 * t + (g + 2 * t) % 8


@kaio.gpu_func
def ring_word(slot: u32, u: u32, warp: u32, chunk: u32, WARPS: kaio.constexpr) -> u32:
    """ASYNC: the u32 index in the words' ring of 16-byte ``chunk`` of load ``u`` of
    ``warp``'s slot ``slot`` (ring [WBUF, LOADS, WARPS, 32 chunks])."""
    return ((slot * LOADS + u) * WARPS + warp) * 128 + 4 * chunk


@kaio.gpu_func
def stage_group(
    ring: u32[:], sring: f16[:], SLOT: kaio.constexpr, w: u32[:, :], scales: f16[:, :],
    group: u32, col: u32, cb: u32, N: u32, warp: u32, lane: u32, tid: u32, WARPS: kaio.constexpr,
):  # fmt: skip
    """ASYNC: start the copies of scale group ``group``'s words and scales of this warp (those
    ``load_group`` loads) into slot SLOT of the shared rings: lane ``l`` copies chunk
    ``l % 8`` of packed row ``4 u + l // 8`` (contiguous lanes, contiguous bytes: whole
    sectors), at ``swizzled``; each thread its own 8 bytes of scales. No register holds them
    while they are in flight."""
    kaio.cp_async_ca(sring, (4 * (SLOT * WARPS * 32 + tid),), scales, (group, col), 8)
    r = lane // 8
    c = lane % 8
    chunk = kaio.select(cb * COLS + 4 * c < N, cb * COLS + 4 * c, 0)
    for u in kaio.static_range(LOADS):
        row = group * ROWS_PER_GROUP + 4 * u + r
        at = ring_word(SLOT, u, warp, swizzled(r, c), WARPS)
        kaio.cp_async_cg(ring, (at,), w, (row, chunk), 16)


@kaio.gpu_func
def read_stage(
    words: u32[:, :, :], sc: u32[:, :], BUF: kaio.constexpr, ring: u32[:], sring: f16[:],
    g: u32, t: u32, warp: u32, tid: u32, WARPS: kaio.constexpr,
):  # fmt: skip
    """ASYNC: buffer BUF's words and scales (lane ``(g, t)``'s, as ``load_group`` loads them)
    from slot BUF of the shared rings (the warp's copies there have landed:
    ``cp_async_wait``, then ``sync_warp``)."""
    kaio.load_vector(sc[BUF], sring, (4 * (BUF * WARPS * 32 + tid),))
    for u in kaio.static_range(LOADS):
        kaio.load_vector(words[BUF, u], ring, (ring_word(BUF, u, warp, swizzled(t, g), WARPS),))


@kaio.gpu_func
def stage_x(
    xring: f16[:], SLOT: kaio.constexpr, x: f16[:, :], group: u32, xcopy: u32,
    xrows: u32[:], xcol: u32, ROWS: kaio.constexpr, CS: kaio.constexpr, KW: kaio.constexpr,
    XS: kaio.constexpr,
):  # fmt: skip
    """XS: start the copies of scale group ``group``'s x (8 ``ROWS`` rows of 128 halves) into
    slot SLOT of this thread's K slice's x ring, shared by the slice's ``CS`` warps: thread
    ``p`` of the slice copies 16-byte chunk ``p % 16`` (x's column ``xcol`` of the group) of
    rows ``p // 16 + 2 CS i`` (x's rows ``xrows[i]``), consecutive threads consecutive chunks
    of a row (whole sectors), at ``xcopy`` (``x_bases``); XS 1 ``.cg`` (L2 only), 2 ``.ca``
    (L1 too: the SM's other blocks may read the same x)."""
    for i in kaio.static_range(4 * ROWS // CS):
        at = xcopy + (SLOT * KW * 16 + 2 * CS * i) * XPITCH
        src = (xrows[i], group * 8 * ROWS_PER_GROUP + xcol)
        if XS == 2:
            kaio.cp_async_ca(xring, (at,), x, src, 16)
        else:
            kaio.cp_async_cg(xring, (at,), x, src, 16)


@kaio.gpu_func
def x_bases(
    xrows: u32[:], warp: u32, tid: u32, g: u32, t: u32, M: u32, ROWS: kaio.constexpr,
    CS: kaio.constexpr,
) -> tuple[u32, u32, u32]:  # fmt: skip
    """XS: this thread's places in its K slice's x ring (ring [WBUF, KW, 16 rows, XPITCH]):
    ``(xread, xcopy, xcol)``, where its reads of row g, chunk t start (``step_x``) and its
    copies of chunk ``p % 16`` (``p`` = the thread among the slice's CS * 32) of row ``p //
    16`` go (``stage_x``), and that chunk's column; ``xrows`` = the x rows of its copies
    (rows past M read row M - 1: their products land in rows never stored)."""
    kslice = warp // CS
    peer = tid % (32 * CS)
    for i in kaio.static_range(4 * ROWS // CS):
        xrows[i] = kaio.min(peer // 16 + 2 * CS * i, M - 1)
    xread = (kslice * 16 + g) * XPITCH + 8 * t
    xcopy = (kslice * 16 + peer // 16) * XPITCH + 8 * (peer % 16)
    return xread, xcopy, 8 * (peer % 16)


@kaio.gpu_func
def x_turn(bars: u64[:], SLOT: kaio.constexpr, kslice: u32, parity: u32, WBUF: kaio.constexpr):
    """XS: wait until slot SLOT of K slice ``kslice``'s x ring holds its group (this thread's
    copies by ``cp_async_wait``, then the slice's other threads' by its mbarrier, phase
    ``parity``); every thread of the slice arriving also says it is done with the slot the
    previous turn read, which the copies ahead then take."""
    kaio.cp_async_wait(WBUF - 2)
    kaio.mbarrier_arrive(bars, kslice * WBUF + SLOT)
    kaio.mbarrier_wait(bars, kslice * WBUF + SLOT, parity)


@kaio.gpu_func
def load_x(
    xq: u32[:, :, :], SLOT: kaio.constexpr, x: f16[:, :], group: u32, u: kaio.constexpr,
    g: u32, t: u32, M: u32, ROWS: kaio.constexpr, XC: kaio.constexpr,
):  # fmt: skip
    """xq[SLOT, r] = the 8 halves of x that load ``u`` of scale group ``group`` multiplies,
    rows g and g + 8 (``ROWS`` of them; rows past M read row M - 1)."""
    k8 = group * ROWS_PER_GROUP + 4 * u + t
    for r in kaio.static_range(ROWS):
        kaio.load_vector(xq[SLOT, r], x, (kaio.min(g + 8 * r, M - 1), 8 * k8), 0, LOAD_CACHES[XC])


@kaio.gpu_func
def lead_x(
    xq: u32[:, :, :], x: f16[:, :], base: u32, s: kaio.constexpr, WARPS: kaio.constexpr,
    last: u32, g: u32, t: u32, M: u32, ROWS: kaio.constexpr, XLEAD: kaio.constexpr,
    XC: kaio.constexpr,
):  # fmt: skip
    """The x fragments of step ``s`` (load ``s % 4`` of the group ``s // 4`` rounds of
    ``WARPS`` past ``base``, at most group ``last``: a step past the warp's groups reads one
    it has) into slot ``s % (XLEAD + 1)`` of the ring xq."""
    group = kaio.min(base + (s // LOADS) * WARPS, last)
    load_x(xq, s % (XLEAD + 1), x, group, s % LOADS, g, t, M, ROWS, XC)


@kaio.gpu_func
def step_x(
    xr: u32[:, :, :, :], BUF: kaio.constexpr, u: kaio.constexpr, xq: u32[:, :, :],
    x: f16[:, :], base: u32, WARPS: kaio.constexpr, last: u32, g: u32, t: u32, M: u32,
    ROWS: kaio.constexpr, XLEAD: kaio.constexpr, XS: kaio.constexpr, xring: f16[:],
    xread: u32, XC: kaio.constexpr,
):  # fmt: skip
    """With ``XLEAD`` > 0: ask for the x fragments of the step ``XLEAD`` loads later
    (``lead_x``), then take this step's (load ``u`` of buffer BUF) from the ring into
    xr[BUF, u]. With ``XS``: read them from slot BUF of the K slice's x ring (``WARPS``
    slices; the lane's row g, chunk t at ``xread``)."""
    if XS > 0:
        for r in kaio.static_range(ROWS):
            at = xread + (BUF * WARPS * 16 + 8 * r) * XPITCH + 32 * u
            kaio.load_vector(xr[BUF, u, r], xring, (at,))
    if XLEAD > 0:
        s = LOADS * BUF + u
        lead_x(xq, x, base, s + XLEAD, WARPS, last, g, t, M, ROWS, XLEAD, XC)
        for r in kaio.static_range(ROWS):
            for e in kaio.static_range(4):
                xr[BUF, u, r, e] = xq[s % (XLEAD + 1), r, e]


@kaio.gpu_func
def dequantize_load(
    b: u32[:, :, :], words: u32[:, :, :], sc: u32[:, :], BUF: kaio.constexpr,
    u: kaio.constexpr, DEQ: kaio.constexpr,
):  # fmt: skip
    """b[i, h, r] = the f16 pair ``scale * q`` of nibbles ``j = 2 h + r`` and ``j + 4`` of
    load ``u``'s word of column i (buffer BUF), by ``DEQ``'s form (2: an ablation, the raw
    words)."""
    for i in kaio.static_range(4):
        twice = LOW_TWICE if i % 2 == 0 else HIGH_TWICE
        scale = kaio.bitcast(kaio.prmt(sc[BUF, i // 2], sc[BUF, i // 2], twice), f16x2)
        if DEQ == 1:
            word_pairs(b, i, words[BUF, u, i], scale)
        elif DEQ == 2:  # ablation (wrong results): the raw words, no dequantization
            for h in kaio.static_range(2):
                b[i, h, 0] = words[BUF, u, i] ^ (sc[BUF, 0] << h)
                b[i, h, 1] = words[BUF, u, i] >> (4 * h + 4)
        else:
            for h in kaio.static_range(2):
                for r in kaio.static_range(2):
                    b[i, h, r] = weight_pair(words[BUF, u, i], 2 * h + r, scale, DEQ)


@kaio.gpu_func
def multiply_group(
    acc: f32[:, :, :], words: u32[:, :, :], xr: u32[:, :, :, :], sc: u32[:, :],
    BUF: kaio.constexpr, x: f16[:, :], group: u32, g: u32, t: u32, M: u32, ROWS: kaio.constexpr,
    DEQ: kaio.constexpr, SWAP: kaio.constexpr, xq: u32[:, :, :], base: u32,
    WARPS: kaio.constexpr, last: u32, XLEAD: kaio.constexpr, XS: kaio.constexpr, xring: f16[:],
    xread: u32, XC: kaio.constexpr,
):  # fmt: skip
    """acc[m] += the products of buffer BUF (scale group ``group``) for each m16 tile m of
    the ``ROWS`` 8-row slabs: 2 k-steps of 16 for each of the 4 loads, for each of the lane's
    4 columns (n8 tiles). Each weight fragment is dequantized once and feeds every tile.
    With ``XLEAD`` (``ROWS`` <= 2), x's fragments come from the ring xq, and each load's
    step first asks for those of the step ``XLEAD`` later (``lead_x``; ``base`` is the
    group of buffer 0 this round); with ``XS`` from the K slice's x ring (``step_x``)."""
    a = kaio.local(u32, (2, 4))
    b = kaio.local(u32, (4, 2, 2))
    xt = kaio.local(u32, (2, 4))
    if SWAP == 1:
        multiply_swapped(
            acc, words, xr, sc, BUF, DEQ, xq, x, base, WARPS, last, g, t, M, ROWS, XLEAD, XS,
            xring, xread, XC,
        )  # fmt: skip
        return
    for u in kaio.static_range(LOADS):
        step_x(xr, BUF, u, xq, x, base, WARPS, last, g, t, M, ROWS, XLEAD, XS, xring, xread, XC)
        dequantize_load(b, words, sc, BUF, u, DEQ)
        for m in kaio.static_range((ROWS + 1) // 2):
            if ROWS > 2:
                k8 = group * ROWS_PER_GROUP + 4 * u + t
                for r in kaio.static_range(2):
                    kaio.load_vector(xt[r], x, (kaio.min(16 * m + g + 8 * r, M - 1), 8 * k8))
            for h in kaio.static_range(2):
                # A register ra: row 16 m + g + 8 (ra % 2), elements j and j + 4, j = 2 h + ra // 2
                for ra in kaio.static_range(4):
                    j = 2 * h + ra // 2
                    sel = LOW_HALVES if j % 2 == 0 else HIGH_HALVES
                    if 2 * m + ra % 2 >= ROWS:
                        a[h, ra] = 0
                    elif DEQ == 6 and ROWS <= 2:  # the weights' pairs are x's own halves
                        a[h, ra] = xr[BUF, u, ra % 2, j]
                    elif DEQ == 6:
                        a[h, ra] = xt[ra % 2, j]
                    elif ROWS > 2:
                        a[h, ra] = kaio.prmt(xt[ra % 2, j // 2], xt[ra % 2, j // 2 + 2], sel)
                    else:
                        a[h, ra] = kaio.prmt(
                            xr[BUF, u, ra % 2, j // 2], xr[BUF, u, ra % 2, j // 2 + 2], sel
                        )
            for i in kaio.static_range(4):
                for h in kaio.static_range(2):
                    if DEQ == 4:  # ablation (wrong results): no mma, one add keeps the inputs
                        mix = a[h, 0] ^ a[h, 1] ^ b[i, h, 0] ^ b[i, h, 1]
                        acc[m, i, h] += kaio.bitcast(mix & 0x3FFFFFFF, f32)
                    elif DEQ == 3:  # ablation (wrong results): half the mma, same dequantization
                        if h == 0:
                            b[i, 0, 0] = b[i, 0, 0] ^ b[i, 1, 0]
                            b[i, 0, 1] = b[i, 0, 1] ^ b[i, 1, 1]
                            kaio.mma_f16(acc[m, i], a[h], b[i, h], acc[m, i])
                    else:
                        kaio.mma_f16(acc[m, i], a[h], b[i, h], acc[m, i])


@kaio.gpu_func
def multiply_swapped(
    acc: f32[:, :, :], words: u32[:, :, :], xr: u32[:, :, :, :], sc: u32[:, :],
    BUF: kaio.constexpr, DEQ: kaio.constexpr, xq: u32[:, :, :], x: f16[:, :], base: u32,
    WARPS: kaio.constexpr, last: u32, g: u32, t: u32, M: u32, ROWS: kaio.constexpr,
    XLEAD: kaio.constexpr, XS: kaio.constexpr, xring: f16[:], xread: u32, XC: kaio.constexpr,
):  # fmt: skip
    """``multiply_group`` at M <= 16 (``ROWS`` 1 or 2) with the roles swapped: the weights
    are the A operand (m16: the lane's columns ``4 g + 2 p`` and ``+ 1`` as rows g and g + 8
    of tile p), x the B operand (n8: x's rows, slab r), so one m16n8k16 takes 256 weights,
    not 128: half the mma at M <= 8. The k order is the unswapped one (pairs j and j + 4 of
    each word, or DEQ 6's bytes); acc[0, 2 r + p, e] is x row ``8 r + 2 t + e % 2``, column
    ``4 g + 2 p + e // 2`` of the block."""
    aw = kaio.local(u32, (2, 2, 4))
    bx = kaio.local(u32, (2, 2, 2))
    b = kaio.local(u32, (4, 2, 2))
    for u in kaio.static_range(LOADS):
        step_x(xr, BUF, u, xq, x, base, WARPS, last, g, t, M, ROWS, XLEAD, XS, xring, xread, XC)
        dequantize_load(b, words, sc, BUF, u, DEQ)
        for i in kaio.static_range(4):
            for h in kaio.static_range(2):
                for r in kaio.static_range(2):
                    aw[i // 2, h, 2 * r + i % 2] = b[i, h, r]
        for s in kaio.static_range(ROWS):
            for h in kaio.static_range(2):
                for r in kaio.static_range(2):
                    sel = LOW_HALVES if r == 0 else HIGH_HALVES
                    if DEQ == 6:  # the weights' pairs are x's own halves
                        bx[s, h, r] = xr[BUF, u, s, 2 * h + r]
                    else:
                        bx[s, h, r] = kaio.prmt(xr[BUF, u, s, h], xr[BUF, u, s, h + 2], sel)
        for s in kaio.static_range(ROWS):
            for p in kaio.static_range(2):
                for h in kaio.static_range(2):
                    kaio.mma_f16(acc[0, 2 * s + p], aw[p, h], bx[s, h], acc[0, 2 * s + p])


@kaio.gpu_func
def prefetch_group(w: u32[:, :], group: u32, block: u32, lane: u32, N: u32, PMODE: kaio.constexpr):
    """Ask L2 for scale group ``group``'s words of this block (16 packed rows of 128 bytes):
    lane ``l`` names the 32-byte sectors ``l % 4`` of rows ``l // 4`` and ``l // 4 + 8``, so
    no register waits on them and the loads that follow find them in L2."""
    if PMODE == 0:
        c = block * COLS + 8 * (lane % 4)
        for p in kaio.static_range(2):
            row = group * ROWS_PER_GROUP + 8 * p + lane // 4
            kaio.prefetch_l2(w, (row, kaio.select(c < N, c, 0)))
    elif lane < ROWS_PER_GROUP:
        c = block * COLS
        if PMODE == 1:
            kaio.prefetch_l2(w, (group * ROWS_PER_GROUP + lane, c))
        elif c + COLS <= N:
            kaio.prefetch_l2(w, (group * ROWS_PER_GROUP + lane, c), 4 * COLS)


@kaio.gpu_func
def word_pairs(b: u32[:, :, :], i: kaio.constexpr, word: u32, scale: f16x2):
    """b[i, h, r] = nibbles ``j`` and ``j + 4`` (``j = 2 h + r``) of ``word`` as the f16 pair
    ``scale * q``, the bits of ``weight_pair`` in fewer instructions: one shift a word, one
    ``lop3`` a pair (mask and magic number), the pairs at bit 4 read as ``1024 + 16 (q + 8)``
    and brought to ``q`` by one exact fma (times 1/16, minus 72)."""
    for h in kaio.static_range(2):
        src = word if h == 0 else word >> 8
        low = kaio.bitcast(kaio.lop3(src, u32(PAIR_MASK), u32(MAGIC), LUT_AND_XOR), f16x2)
        b[i, h, 0] = kaio.bitcast((low - kaio.bitcast(u32(MAGIC), f16x2)) * scale, u32)
        high = kaio.bitcast(
            kaio.lop3(src, u32(PAIR_MASK << 4), u32(MAGIC_HIGH), LUT_AND_XOR), f16x2
        )
        q = kaio.fma(high, kaio.bitcast(u32(SIXTEENTH), f16x2), kaio.bitcast(u32(MINUS_72), f16x2))
        b[i, h, 1] = kaio.bitcast(q * scale, u32)


@kaio.gpu_func
def weight_pair(word: u32, j: kaio.constexpr, scale: f16x2, DEQ: kaio.constexpr) -> u32:
    """Nibbles ``j`` and ``j + 4`` of ``word`` as the f16 pair ``scale * q`` (DEQ 5: the mask
    and the magic number in one ``lop3``, the same bits; DEQ 6: nibbles ``2 j`` and
    ``2 j + 1``, byte j, the k order of x's own halves: byte j put in both halves by one
    ``prmt``, then one ``lop3``)."""
    if DEQ == 6:
        both = kaio.prmt(word, word, u32(0x1111 * j))
        fused = kaio.lop3(both, u32(BYTE_MASK), u32(MAGIC_BYTE), LUT_AND_XOR)
        return kaio.bitcast(
            (kaio.bitcast(fused, f16x2) - kaio.bitcast(u32(MAGIC_BYTE), f16x2)) * scale, u32
        )
    if DEQ == 5:
        fused = kaio.lop3(word >> (4 * j), u32(PAIR_MASK), u32(MAGIC), LUT_AND_XOR)
        biased = kaio.bitcast(fused, f16x2)
    else:
        biased = kaio.bitcast(((word >> (4 * j)) & PAIR_MASK) ^ MAGIC, f16x2)
    return kaio.bitcast((biased - kaio.bitcast(u32(MAGIC), f16x2)) * scale, u32)


@kaio.gpu_func
def buffer_step(
    acc: f32[:, :, :], words: u32[:, :, :], xr: u32[:, :, :, :], sc: u32[:, :],
    xq: u32[:, :, :], B: kaio.constexpr, w: u32[:, :], x: f16[:, :], scales: f16[:, :],
    base: u32, groups: u32, col: u32, g: u32, t: u32, M: u32, ROWS: kaio.constexpr,
    L2F: kaio.constexpr, XLEAD: kaio.constexpr, DEQ: kaio.constexpr, SWAP: kaio.constexpr,
    WARPS: kaio.constexpr, last: u32, WBUF: kaio.constexpr, WC: kaio.constexpr,
    ASYNC: kaio.constexpr, ring: u32[:], sring: f16[:], cb: u32, N: u32, warp: u32, tid: u32,
    BLOCK_WARPS: kaio.constexpr, XS: kaio.constexpr, xring: f16[:], bars: u64[:], parity: u32,
    CS: kaio.constexpr, xread: u32, xcopy: u32, xrows: u32[:], xcol: u32, XC: kaio.constexpr,
):  # fmt: skip
    """Buffer B's turn in a round of ``WBUF`` groups from ``base`` (``WARPS`` apart): first
    the loads of the group ``WBUF - 1`` later into the buffer the previous turn freed, then
    buffer B's products. With ``ASYNC`` the buffers are the slots of the shared rings: slot B
    is waited for and read into registers, then the copies of the group ahead go into the slot
    the previous turn read, committed (a group of copies every turn, empty or not);
    ``BLOCK_WARPS`` (the block's, of which ``WARPS`` split K) lays the rings out. With ``XS``
    x's slot B of the K slice's ring is waited for the same way, by the slice's ``CS`` warps
    together (``x_turn``, phase ``parity``), and x's copies of the group ahead join the
    turn's."""
    ahead = base + (B + WBUF - 1) * WARPS
    kslice = warp // CS
    if ASYNC == 0 and ahead < groups:  # first: XS's wait must not hold the words back
        load_group(
            words, xr, sc, (B + WBUF - 1) % WBUF, w, x, scales, ahead, col, g, t, M, ROWS, L2F,
            XLEAD, WC, XS, XC,
        )  # fmt: skip
    if ASYNC > 0 or XS > 0:
        if XS > 0:
            x_turn(bars, B, kslice, parity, WBUF)
        else:
            kaio.cp_async_wait(WBUF - 2)
            kaio.sync_warp()  # every lane's copies of slot B landed; slot B - 1 is read
        if ASYNC > 0:
            read_stage(words, sc, B, ring, sring, g, t, warp, tid, BLOCK_WARPS)
        if ahead < groups:
            if ASYNC > 0:
                stage_group(
                    ring, sring, (B + WBUF - 1) % WBUF, w, scales, ahead, col, cb, N, warp,
                    g * 4 + t, tid, BLOCK_WARPS,
                )  # fmt: skip
            if XS > 0:
                stage_x(
                    xring, (B + WBUF - 1) % WBUF, x, ahead, xcopy, xrows, xcol, ROWS, CS, WARPS,
                    XS,
                )  # fmt: skip
        kaio.cp_async_commit()
    multiply_group(
        acc, words, xr, sc, B, x, base + B * WARPS, g, t, M, ROWS, DEQ, SWAP, xq, base, WARPS,
        last, XLEAD, XS, xring, xread, XC,
    )  # fmt: skip


@kaio.gpu_func
def decode_columns(
    x: f16[:, :], w: u32[:, :], scales: f16[:, :], out: DT[:, :], partial: f32[:, :, :],
    M: u32, N: u32, block: u32, WARPS: kaio.constexpr, ROWS: kaio.constexpr, DT: kaio.constexpr,
    PREFETCH: kaio.constexpr, DEQ: kaio.constexpr, ws: f32[:, :, :], counters: i32[:], lo: u32,
    hi: u32, part: u32, parts: u32, slot: u32, SPLIT: kaio.constexpr, PMODE: kaio.constexpr,
    L2F: kaio.constexpr, SWAP: kaio.constexpr, XLEAD: kaio.constexpr, WBUF: kaio.constexpr,
    CS: kaio.constexpr, WC: kaio.constexpr, ASYNC: kaio.constexpr, XS: kaio.constexpr,
    XC: kaio.constexpr, PDL: kaio.constexpr,
):  # fmt: skip
    """With ``CS`` 1, out[:, 32 block .. 32 block + 31] = those columns of ``x @ W`` (W =
    scales * the nibbles of w, see the module docstring), rounded to DT (the output's type), for
    the ``ROWS`` 8-row slabs of x (``_rows``: 1 when M <= 8, rows g + 8 of A are zero; else
    2 per m16 tile). Each warp's groups go through two register buffers: the next group's
    loads are in flight while the current one is multiplied; ``partial`` [WARPS, 16, 32]
    (shared) adds the warps' tiles in a fixed order, one m16 tile at a time. ``PREFETCH``
    > 0: each warp asks L2 for its groups that many rounds of two groups past the two in
    its registers (``prefetch_group``). The block takes K's scale groups ``lo`` to ``hi``
    (all of them, or a part of a K split); with ``SPLIT`` > 1 (M <= 16) and ``parts`` > 1
    (1 for a block that takes its columns whole) it is part ``part`` of ``parts`` and leaves
    its sums in ``ws[part, slot]``; the last of the blocks of those columns to finish
    (``counters[slot]``, back to 0 after) adds the parts in order into ``out``. ``CS`` > 1:
    the block's warps take CS column blocks from ``CS block``, warp w column block
    ``CS block + w % CS`` and the groups ``w // CS``, ``w // CS + WARPS // CS``, ... from
    ``lo``: the warps of one such run load the same x at about the same time (L1 hits, not
    L2 traffic). ``ASYNC`` (with XLEAD): the words and scales go through rings of WBUF
    slots in shared memory (``ring``, ``sring``) by ``cp.async``, WBUF - 1 groups in flight
    a warp without their registers. ``XS``: x goes through a ring of WBUF slots in shared
    memory by ``cp.async`` too, one per K slice (the CS warps of one run of groups), each
    group's x copied once for the slice's CS column blocks (x's L2 traffic divided by CS),
    the slice's warps meeting at an mbarrier a turn (``x_turn``)."""
    KW = WARPS // CS  # the warps that split K
    # The rings (``ring_bytes`` of dynamic shared memory at launch): ASYNC's words
    # (``ring_word``), then each thread's scales [WBUF, threads, 4], then XS's x
    # (``x_bases``) and its mbarriers [KW, WBUF]; 16 bytes each without them
    RING_WORDS = ASYNC * WBUF * LOADS * WARPS * 128 + 4 - 4 * ASYNC
    SRING_HALVES = ASYNC * WBUF * WARPS * 128 + 8 - 8 * ASYNC
    XON = (XS + 1) // 2  # 1 with XS 1 or 2
    XRING_HALVES = XON * WBUF * KW * XSLOT + 8 - 8 * XON
    ring = kaio.shared_dynamic(u32, (RING_WORDS,), 0)
    sring = kaio.shared_dynamic(f16, (SRING_HALVES,), 4 * RING_WORDS)
    xring = kaio.shared_dynamic(f16, (XRING_HALVES,), 4 * RING_WORDS + 2 * SRING_HALVES)
    XBARS_AT = 4 * RING_WORDS + 2 * SRING_HALVES + 2 * XRING_HALVES
    bars = kaio.shared_dynamic(u64, (XON * WBUF * KW + 2 - 2 * XON,), XBARS_AT)
    tid = kaio.thread_idx_x()
    warp = tid // 32
    lane = tid % 32
    g = lane // 4
    t = lane % 4
    cb = block * CS + warp % CS
    col = column(cb, g, N)
    first = lo + warp // CS
    groups = hi
    acc = kaio.local(f32, ((ROWS + 1) // 2, 4, 4))
    for m in kaio.static_range((ROWS + 1) // 2):
        for i in kaio.static_range(4):
            for e in kaio.static_range(4):
                acc[m, i, e] = 0.0
    words = kaio.local(u32, (WBUF, LOADS, 4))
    xr = kaio.local(u32, (WBUF, LOADS, 2, 4))
    xq = kaio.local(u32, (XLEAD + 1, 2, 4))
    sc = kaio.local(u32, (WBUF, 2))
    last = kaio.max(groups, 1) - 1
    xrows = kaio.local(u32, (4 * ROWS // CS + 1,))
    xread, xcopy, xcol = u32(0), u32(0), u32(0)
    if XS > 0:
        xread, xcopy, xcol = x_bases(xrows, warp, tid, g, t, M, ROWS, CS)
        if tid < KW * WBUF:
            kaio.mbarrier_init(bars, tid, 32 * CS)  # every thread of the K slice arrives
        kaio.sync_threads()
    for b in kaio.static_range(WBUF - 1):
        if first + b * KW < groups:
            if ASYNC > 0:
                stage_group(
                    ring, sring, b, w, scales, first + b * KW, col, cb, N, warp, lane, tid, WARPS
                )
            else:
                load_group(
                    words, xr, sc, b, w, x, scales, first + b * KW, col, g, t, M, ROWS, L2F,
                    XLEAD, WC, XS, XC,
                )  # fmt: skip
            if XS > 0:
                stage_x(xring, b, x, first + b * KW, xcopy, xrows, xcol, ROWS, CS, KW, XS)
        if ASYNC > 0 or XS > 0:
            kaio.cp_async_commit()
    for s in kaio.static_range(XLEAD):
        lead_x(xq, x, first, s, KW, last, g, t, M, ROWS, XLEAD, XC)
    for d in kaio.static_range(WBUF, WBUF * PREFETCH + WBUF):
        if first + d * KW < groups:
            prefetch_group(w, first + d * KW, cb, lane, N, PMODE)
    for group in range(first, groups, WBUF * KW):
        if PREFETCH > 0:
            for d in kaio.static_range(WBUF * PREFETCH + WBUF, WBUF * PREFETCH + 2 * WBUF):
                if group + d * KW < groups:
                    prefetch_group(w, group + d * KW, cb, lane, N, PMODE)
        parity = ((group - first) // (WBUF * KW)) % 2  # XS: the round's phase of each slot
        for b in kaio.static_range(WBUF):
            if b == 0:  # group < groups in the loop
                buffer_step(
                    acc, words, xr, sc, xq, b, w, x, scales, group, groups, col, g, t, M, ROWS,
                    L2F, XLEAD, DEQ, SWAP, KW, last, WBUF, WC, ASYNC, ring, sring, cb, N, warp, tid,
                    WARPS, XS, xring, bars, parity, CS, xread, xcopy, xrows, xcol, XC,
                )  # fmt: skip
            elif group + b * KW < groups:
                buffer_step(
                    acc, words, xr, sc, xq, b, w, x, scales, group, groups, col, g, t, M, ROWS,
                    L2F, XLEAD, DEQ, SWAP, KW, last, WBUF, WC, ASYNC, ring, sring, cb, N, warp, tid,
                    WARPS, XS, xring, bars, parity, CS, xread, xcopy, xrows, xcol, XC,
                )  # fmt: skip
    if PDL == 4:
        kaio.launch_dependents()  # the loads are done: the next kernel may launch
    sum_warps(
        acc, partial, out, ws, M, N, block, part, parts, slot, warp, tid, g, t, ROWS, SWAP,
        WARPS, CS, SPLIT, DT,
    )  # fmt: skip
    if SPLIT > 1 and parts > 1:
        add_parts(out, ws, counters, partial, slot, block, M, N, tid, WARPS, SPLIT, CS, DT)


@kaio.gpu_func
def sum_warps(
    acc: f32[:, :, :], partial: f32[:, :, :], out: DT[:, :], ws: f32[:, :, :], M: u32, N: u32,
    block: u32, part: u32, parts: u32, slot: u32, warp: u32, tid: u32, g: u32, t: u32,
    ROWS: kaio.constexpr, SWAP: kaio.constexpr, WARPS: kaio.constexpr, CS: kaio.constexpr,
    SPLIT: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """The warps' sums ``acc`` of the ``CS`` column blocks from ``CS block`` added in a fixed
    order through ``partial`` (shared), one m16 tile at a time, into ``out`` (rounded to DT),
    or with ``SPLIT`` > 1 and ``parts`` > 1 into ``ws[part, slot]`` (the K split's fixup,
    ``add_parts``, adds them). Every warp's ``partial`` reads of an earlier call are done."""
    for m in kaio.static_range((ROWS + 1) // 2):
        if m > 0:
            kaio.sync_threads()  # the previous tile's partial sums are all read
        if SWAP == 1:
            for slab in kaio.static_range(ROWS):
                for p in kaio.static_range(2):
                    for e in kaio.static_range(4):
                        row = 8 * slab + 2 * t + e % 2
                        partial[warp, row, 4 * g + 2 * p + e // 2] = acc[0, 2 * slab + p, e]
        else:
            for i in kaio.static_range(4):
                for e in kaio.static_range(4):
                    partial[warp, g + 8 * (e // 2), 4 * (2 * t + e % 2) + i] = acc[m, i, e]
        kaio.sync_threads()
        for k in kaio.static_range(-(-CS * 16 * COLS // (WARPS * 32))):
            o = tid + k * WARPS * 32
            if (k + 1) * WARPS * 32 <= CS * 16 * COLS:  # every thread has an element
                sum_element(partial, out, ws, o, M, N, block, m, part, parts, slot, WARPS, CS,
                            SPLIT, DT)  # fmt: skip
            elif o < CS * 16 * COLS:  # (a number of warps that does not divide them)
                sum_element(partial, out, ws, o, M, N, block, m, part, parts, slot, WARPS, CS,
                            SPLIT, DT)  # fmt: skip


@kaio.gpu_func
def sum_element(
    partial: f32[:, :, :], out: DT[:, :], ws: f32[:, :, :], o: u32, M: u32, N: u32, block: u32,
    m: kaio.constexpr, part: u32, parts: u32, slot: u32, WARPS: kaio.constexpr,
    CS: kaio.constexpr, SPLIT: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """``sum_warps``' element ``o`` (of CS x 16 x 32) of m16 tile ``m``: the warps' partial
    sums added in warp order, into ``out`` or ``ws[part, slot]``."""
    r = o // COLS
    cs = u32(0)
    if CS > 1:
        cs = r // 16
        r = r % 16
    c = (block * CS + cs) * COLS + o % COLS
    total = partial[cs, r, o % COLS]
    for s in kaio.static_range(1, WARPS // CS):
        total += partial[s * CS + cs, r, o % COLS]
    if SPLIT > 1 and parts > 1:
        if r < M:
            ws[part, slot, o] = total
    elif 16 * m + r < M and c < N:
        out[16 * m + r, c] = DT(total)


@kaio.gpu_func
def add_parts(
    out: DT[:, :], ws: f32[:, :, :], counters: i32[:], partial: f32[:, :, :], slot: u32,
    block: u32, M: u32, N: u32, tid: u32, WARPS: kaio.constexpr, SPLIT: kaio.constexpr,
    CS: kaio.constexpr, DT: kaio.constexpr,
):  # fmt: skip
    """A K split's end: the last of the SPLIT blocks of the ``CS`` column blocks from
    ``CS block`` to arrive (``counters[slot]``, back to 0 after) adds their sums in
    ``ws[:, slot]`` in part order into ``out`` (fence, then count: the parts of every block
    counted are visible to the one that counts last)."""
    kaio.threadfence()
    kaio.sync_threads()
    if tid == 0:
        last = kaio.atomic_add(counters, slot, i32(1)) == SPLIT - 1
        if last:
            counters[slot] = i32(0)  # ready for the next call (or graph replay)
        partial[0, 0, 0] = kaio.select(last, 1.0, 0.0)
    kaio.sync_threads()
    if partial[0, 0, 0] == 1.0:
        kaio.threadfence()
        for k in kaio.static_range(-(-CS * 16 * COLS // (WARPS * 32))):
            o = tid + k * WARPS * 32
            r = (o // COLS) % 16
            c = (block * CS + o // (16 * COLS)) * COLS + o % COLS
            if o < CS * 16 * COLS and r < M and c < N:
                total = ws[0, slot, o]
                for s in kaio.static_range(1, SPLIT):
                    total += ws[s, slot, o]
                out[r, c] = DT(total)


@kaio.gpu_func
def decode_bounds(WARPS: kaio.constexpr, ROWS: kaio.constexpr, MINB: kaio.constexpr):
    """The decode kernels' launch bounds: blocks of ``WARPS`` warps, ``MINB`` blocks a
    multiprocessor when given, else one block an SM past 2 rows a warp (ptxas may spill to
    fit 128 registers otherwise)."""
    if MINB > 0:
        kaio.launch_bounds(WARPS * 32, MINB)
    elif ROWS > 2:
        kaio.launch_bounds(WARPS * 32, 1)
    else:
        kaio.launch_bounds(WARPS * 32)


@kaio.gpu_kernel
def int4_decode(
    x: f16[:, :], w: u32[:, :], scales: f16[:, :], out: DT[:, :],
    M: u32, N: u32,
    WARPS: kaio.constexpr, ROWS: kaio.constexpr, DT: kaio.constexpr, PREFETCH: kaio.constexpr,
    DEQ: kaio.constexpr, MINB: kaio.constexpr, PMODE: kaio.constexpr, L2F: kaio.constexpr,
    SWAP: kaio.constexpr, ws: f32[:, :, :], counters: i32[:], whole: u32,
    SPLIT: kaio.constexpr, XLEAD: kaio.constexpr, WBUF: kaio.constexpr, CS: kaio.constexpr,
    WC: kaio.constexpr, ASYNC: kaio.constexpr, XS: kaio.constexpr, XC: kaio.constexpr,
    PDL: kaio.constexpr,
):  # fmt: skip
    """``out = x @ W`` (``decode_columns``), a block per ``CS`` column blocks; with SPLIT > 1
    the blocks from ``whole`` on take SPLIT parts of K each (block ``whole + j``: part
    ``j % SPLIT`` of the column blocks ``whole + j // SPLIT``; ``whole`` 0: all of them).
    ``PDL`` (sm_90): launched with programmatic dependent launch (``await_previous``)."""
    decode_bounds(WARPS, ROWS, MINB)
    partial = kaio.shared(f32, (WARPS, 16, COLS))
    b = kaio.block_idx_x()
    groups = u32(scales.shape[0])
    block, part, parts = b, u32(0), u32(1)
    if SPLIT > 1 and b >= whole:
        block = whole + (b - whole) // SPLIT
        part = (b - whole) % SPLIT
        parts = u32(SPLIT)
    lo = part * groups // parts
    hi = (part + 1) * groups // parts
    await_previous(w, block, lo, hi, N, WARPS, CS, WBUF, PDL)
    decode_columns(
        x, w, scales, out, partial, M, N, block, WARPS, ROWS, DT, PREFETCH, DEQ, ws, counters,
        lo, hi, part, parts, block - whole, SPLIT, PMODE, L2F, SWAP, XLEAD, WBUF, CS, WC, ASYNC,
        XS, XC, PDL,
    )  # fmt: skip


@kaio.gpu_func
def column(cb: u32, g: u32, N: u32) -> u32:
    """Lane group ``g``'s first column of column block ``cb`` (column 0 past N: those
    products are never stored)."""
    return kaio.select(cb * COLS + 4 * g < N, cb * COLS + 4 * g, 0)


@kaio.gpu_func
def await_previous(
    w: u32[:, :], block: u32, lo: u32, hi: u32, N: u32, WARPS: kaio.constexpr,
    CS: kaio.constexpr, WBUF: kaio.constexpr, PDL: kaio.constexpr,
):  # fmt: skip
    """``PDL``: wait for the kernel before this one (``grid_dependency_wait``) before any
    global memory is touched; 3: first let the kernel after this one be placed
    (``launch_dependents``: its blocks take the slots this grid's leave) and ask L2 for the
    words of this warp's first WBUF groups (of ``lo`` to ``hi``, column block ``CS block +
    warp % CS``): a prefetch reads nothing the earlier kernel may still write."""
    if PDL == 3:
        kaio.launch_dependents()
        warp = kaio.thread_idx_x() // 32
        for b in kaio.static_range(WBUF):
            group = lo + warp // CS + b * (WARPS // CS)
            if group < hi:
                prefetch_group(w, group, block * CS + warp % CS, kaio.thread_idx_x() % 32, N, 0)
    if PDL > 0:
        kaio.grid_dependency_wait()


@kaio.gpu_kernel
def int4_decode_qkv(
    x: f16[:, :], wq: u32[:, :], wk: u32[:, :], wv: u32[:, :], sq: f16[:, :], sk: f16[:, :],
    sv: f16[:, :], q: DT[:, :], k: DT[:, :], v: DT[:, :],
    M: u32, NQ: u32, NK: u32,
    WARPS: kaio.constexpr, ROWS: kaio.constexpr, DT: kaio.constexpr, PREFETCH: kaio.constexpr,
    DEQ: kaio.constexpr, MINB: kaio.constexpr, PMODE: kaio.constexpr, L2F: kaio.constexpr,
    SWAP: kaio.constexpr, ws: f32[:, :, :], counters: i32[:], XLEAD: kaio.constexpr,
    WBUF: kaio.constexpr, WC: kaio.constexpr, ASYNC: kaio.constexpr, XS: kaio.constexpr,
):  # fmt: skip
    """``q, k, v = x @ Wq, x @ Wk, x @ Wv`` in one launch: the blocks of q's columns, then
    k's, then v's (each block exactly a block of ``int4_decode``)."""
    decode_bounds(WARPS, ROWS, MINB)
    partial = kaio.shared(f32, (WARPS, 16, COLS))
    bq = (NQ + COLS - 1) // COLS
    bk = (NK + COLS - 1) // COLS
    block = kaio.block_idx_x()
    if block < bq:
        decode_columns(
            x, wq, sq, q, partial, M, NQ, block, WARPS, ROWS, DT, PREFETCH, DEQ, ws, counters,
            0, u32(sq.shape[0]), 0, 1, 0, 1, PMODE, L2F, SWAP, XLEAD, WBUF, 1, WC, ASYNC, XS, 0,
            0,
        )  # fmt: skip
    elif block < bq + bk:
        decode_columns(
            x, wk, sk, k, partial, M, NK, block - bq, WARPS, ROWS, DT, PREFETCH, DEQ, ws,
            counters, 0, u32(sk.shape[0]), 0, 1, 0, 1, PMODE, L2F, SWAP, XLEAD, WBUF, 1, WC,
            ASYNC, XS, 0, 0,
        )  # fmt: skip
    else:
        nv = u32(v.shape[1])
        decode_columns(
            x, wv, sv, v, partial, M, nv, block - bq - bk, WARPS, ROWS, DT, PREFETCH, DEQ, ws,
            counters, 0, u32(sv.shape[0]), 0, 1, 0, 1, PMODE, L2F, SWAP, XLEAD, WBUF, 1, WC,
            ASYNC, XS, 0, 0,
        )  # fmt: skip


WARPS = 8  # the default (and past 16 rows); plan picks 4, 8 or 16 at M <= 16
MAX_M = 64  # up to 4 m16 tiles per block; past this _prefill or the tiled kernel
DEQ = 5  # 0: weight_pair, 1: word_pairs, 5: weight_pair's lop3 (the same bits); 2-4 ablations
PREFETCH = 0  # rounds of two groups a warp asks L2 for ahead of its registers (0: none)
MINB = 0  # blocks an SM for launch_bounds (0: ptxas's choice, 1 past 16 rows)
SPLIT = 1  # blocks a column block (K split) at M <= 16
PMODE = 0  # the prefetch's form: 0 a lane's 32-byte sectors, 1 a line a row, 2 bulk (sm_90)
SWAP = 1  # the weights as mma's A operand (multiply_swapped): 1 at M <= 8, 2 at M <= 16
L2F = 0  # the words' loads: bytes L2 fetches on a miss (0: its own choice, 64/128/256)
XLEAD = 0  # ROWS <= 2: x's fragments XLEAD loads ahead in a ring (0: with the words; XLEAD + 1
# divides 4 WBUF)
WBUF = 2  # register buffers of words a warp (groups in flight: WBUF - 1)
CS = 1  # matmul: 32-column blocks a block (its warps split K CS times less)
WC = 0  # the words' cache operator: LOAD_CACHES[WC] (1 .cg: L2 only, L1 keeps x; 2 .cs; ...)
XC = 0  # x's loads at M <= 16 (with the words or by XLEAD): LOAD_CACHES[XC]
ASYNC = 0  # 1: the words and scales through WBUF-slot rings in shared memory by cp.async
XS = 0  # ROWS <= 2: x through WBUF-slot rings in shared memory, one a K slice of CS warps, copied
# .cg (1) or .ca (2)
TUNED = {
    "PREFETCH": PREFETCH,
    "DEQ": DEQ,
    "MINB": MINB,
    "PMODE": PMODE,
    "L2F": L2F,
    "SWAP": SWAP,
    "XLEAD": XLEAD,
    "WBUF": WBUF,
    "CS": CS,
    "WC": WC,
    "ASYNC": ASYNC,
    "XS": XS,
    "XC": XC,
}  # the constexprs matmul's tune overrides


def fits(x: _arrays.Operand, *weights: tuple) -> bool:
    """Whether the decode kernels take activations ``x`` [M, K] and these ``(words, scales)``
    pairs: M <= 64, each N a multiple of 4 (16-byte loads of 4 columns), x and the words
    16-byte aligned, the scales 8-byte aligned."""
    return x.shape[0] <= MAX_M and all(
        w.shape[1] % 4 == 0 and w.aligned(16) and s.aligned(8) for w, s in weights
    ) and x.aligned(16)  # fmt: skip


def _words(w: _arrays.Operand):
    """The packed words as a u32 kernel argument (int32 words are the same bytes)."""
    return w.arg(dtype=u32)


def ring_bytes(warps: int, tuned: dict) -> int:
    """The dynamic shared memory of the rings: ASYNC's WBUF slots of each thread's 4 16-byte
    loads of words and its 8 bytes of scales (2 x 16 bytes without ASYNC), then XS's WBUF
    slots of 16 padded rows of a group's x (5 KB) a K slice and their mbarriers (16 bytes
    each without XS)."""
    slots = tuned["WBUF"]
    rings = slots * warps * 32 * (LOADS * 16 + 8) if tuned["ASYNC"] else 32
    slices = warps // tuned.get("CS", 1)  # qkv: a block per 32 columns
    return rings + (slots * slices * (2 * XSLOT + 8) if tuned["XS"] else 32)


def _config(x: _arrays.Operand, blocks: int, warps: int, tuned: dict) -> tuple:
    """The launch configuration: ``blocks`` blocks of ``warps`` warps, ``tuned``'s rings."""
    return (blocks, warps * 32, _arrays.stream_of(x), ring_bytes(warps, tuned))


def tail_whole(units: int, sms: int, parts: int) -> int:
    """``TAIL``: the blocks (of ``units``, one per ``CS`` column blocks) taken whole when
    the rest, the last partial round of one block an SM on ``sms`` multiprocessors, is split
    over K in ``parts`` blocks each, at most one of them an SM: the SMs that would hold one
    block more than the others hold a part more instead. ``units`` (nothing split) where
    there is no partial round, no whole one, or too many blocks left for one part an SM."""
    whole = units // sms * sms
    rest = units - whole
    if not whole or not rest or rest * parts > sms:
        return units
    return whole


def _tuned(m: int, tune: dict | None = None) -> dict:
    """``TUNED`` with ``tune``'s overrides, for M = ``m`` (SWAP only at M <= 8, ROWS 1)."""
    tuned = {**TUNED, **(tune or {})}
    if _rows(m) > tuned["SWAP"]:
        tuned["SWAP"] = 0  # SWAP 1: at M <= 8, 2: at M <= 16 too; the kernel's SWAP is 0 or 1
    tuned["SWAP"] = min(tuned["SWAP"], 1)
    if _rows(m) > 2:
        tuned["XLEAD"] = 0  # past one m16 tile x is loaded where it is used
        tuned["ASYNC"] = 0
        tuned["XS"] = 0
    if tuned["XS"]:
        tuned["XLEAD"] = 0  # x comes from its ring
    elif tuned["ASYNC"] and not tuned["XLEAD"]:
        tuned["XLEAD"] = 3  # the rings hold no x: x's fragments 3 loads ahead
    return tuned


def _split_arrays(x: _arrays.Operand, units: int, split: int, cs: int = 1) -> dict:
    """The kernels' ``ws`` and ``counters`` for a K split over ``split`` blocks of ``units``
    blocks of ``cs`` column blocks: the parts' f32 sums [split, units, cs * 16 * 32] and the
    zeroed arrival counts (placeholders when ``split`` is 1)."""
    from kaio_ops.linear import _counters, _placeholder

    if split == 1:
        return {"ws": _placeholder(x, f32, 3), "counters": _placeholder(x, i32, 1)}
    ws = _arrays.output(x, (split, units, cs * 16 * COLS), f32)
    return {"ws": ws, "counters": _counters(x, units)}


SWAPPED = {"SWAP": 2, "DEQ": 6}  # M = 9-16: the swapped mma, a byte's nibbles a pair
# M = 9-16 up to ten tiles an SM: x's loads by the read-only path (.nc), the words' not
# allocated in L1; programmatic dependent launch with the first groups' L2 prefetches before
# the wait (PDL 3; the plans with a K split take the wait alone, PDL 1)
LOADS_16 = {"XC": 3, "WC": 6, "PDL": 3}
SWAPPED_16 = {**SWAPPED, **LOADS_16}
# M = 9-16 past ten tiles an SM: blocks of two column blocks whose warps of one K slice share
# x through its shared ring (copied .ca), the words through theirs
SHARED_X_16 = {**SWAPPED, "CS": 2, "XS": 2, "ASYNC": 1}
# M <= 8 past two tiles an SM: a byte's nibbles a pair, the words through the shared rings
# (72-76 registers), x 3 loads ahead
RINGS_8 = {"DEQ": 6, "XLEAD": 3, "ASYNC": 1, "WBUF": 2}
# M <= 8 at three to four tiles an SM where the last partial round is split in halves: a
# byte's nibbles a pair, x with the words, LOADS_16's cache operators (110 registers in blocks
# of 4: four an SM, every block at once)
LOADS_8 = {"DEQ": 6, "XC": 3, "WC": 6}
# M = 9-16 past five tiles an SM: blocks of 4 over two column blocks, x 3 loads ahead, the last
# partial round of one block an SM split over K in halves
PAIRS_16 = {**SWAPPED_16, "XLEAD": 3, "CS": 2, "TAIL": 2, "PDL": 1}


def halves(warps: int, groups: int, least: int) -> dict:
    """``TAIL`` 2 (and ``PDL`` 1, the split's launch) where a warp of a block of ``warps``
    keeps ``least`` or more of the ``groups`` scale groups of its half of K: shorter halves
    measured no faster on an H100 (``least`` 4 at M <= 8: 10240 x 4096 in blocks of 8, two
    groups a warp, 11.6 -> 12.2 µs; 8 at M = 9-16: 10240 x 4096 in blocks of 4, four a warp,
    12.1 -> 12.4 µs; docs/performance.md, "W4A16 decode, eleventh pass")."""
    return {"TAIL": 2, "PDL": 1} if groups >= 2 * least * warps else {}


def plan(
    m: int, tiles: int, sms: int, groups: int, shared_x: bool = True, fast: bool = False
) -> tuple[int, dict]:
    """(warps a block, ``TUNED`` overrides) at M = ``m`` over ``tiles`` 32-column blocks on ``sms``
    multiprocessors and K's ``groups`` scale groups, measured on an H100 (bench/int4_decode.py;
    docs/performance.md, "W4A16 decode, M <= 16, third pass"); ``shared_x`` whether ``XS`` may be
    taken (its turns wait at mbarriers: sm_90); ``fast`` whether the GPU has the faster memory
    (``_arrays.fast_memory``: an H200), whose plans differ where measured on an H200 ("W4A16
    decode, fifteenth pass"): at M <= 8 ``LOADS_8`` with PDL 3 up to two tiles an SM (blocks of
    16, then 8, as on the slower memory) and past ten tiles an SM (blocks of 8, not the rings);
    at M = 9-16 past ten tiles an SM ``PAIRS_16``, not ``SHARED_X_16``.

    At M <= 8 (the swapped mma): blocks of 16 warps while every tile has an SM of its own (N <= 4224
    on 132 SMs: 16 warps an SM instead of 8, half the groups a warp); blocks of 8 while the tiles
    fit two 8-warp blocks an SM; past that ``RINGS_8`` (DEQ 6, the words through shared rings by
    cp.async, x 3 loads ahead: 72-76 registers), in blocks of 8 up to three tiles an SM (three
    blocks an SM; N = 10240), of 4 past four tiles an SM (N = 28672), of 4 taking two column blocks
    each past ten (``CS`` 2, N > 42240; ``qkv`` keeps main's blocks of 4 there) ("W4A16 decode, M <=
    16, fifth pass"; "eleventh pass" for the bound at three tiles an SM); between three and four
    tiles an SM, where the last partial round is split (N = 14336), ``LOADS_8``, blocks of 4 without
    the rings, x with the words (four an SM: every block at once; "W4A16 decode, twelfth pass"; not
    where nothing is split: N = 16384); up to four tiles an SM the last partial round split over K
    in halves where they are long enough (``halves``); up to ten tiles an SM launched with
    programmatic dependent launch, ``PDL`` 3 without the rings (``LOADS_8`` too, with its halves:
    "twelfth pass"), 1 with them ("W4A16 decode, M 9-16, tenth pass", measured at M = 1). At M =
    9-16 the swapped mma and DEQ 6 (x's halves as they are loaded: no prmt for x, two n8 tiles of x
    a k-step), blocks of 8, x with the words while every tile has an SM (149 registers), x 3 loads
    ahead (124 registers: 16 warps an SM) up to two tiles an SM; between, blocks of 4 with x with
    the words while they fit the SMs at once, three an SM (153 registers; N = 10240, with
    ``halves``: "eleventh pass"; swapped: "W4A16 decode, fourteenth pass"), then blocks of 4 with
    x 3 loads ahead (124 registers, four an SM) up
    to four tiles an SM (N = 14336), blocks of 3 (five an SM, 15 warps) up to five (N = 20480;
    ``qkv`` keeps blocks of 4; "W4A16 decode, M 9-16, tenth pass"; launched with ``PDL`` 4: "twelfth
    pass"), past that each block two column blocks (``CS`` 2, N = 28672; ``qkv`` takes CS 1) with
    the last partial round of one block an SM split over K in halves (``TAIL`` 2: ``tail_whole``;
    "W4A16 decode, M 9-16, eighth pass"; ``qkv`` takes no split); past ten tiles an SM (N > 42240)
    ``SHARED_X_16``: blocks of 4 warps over two column blocks, each K slice's x copied once into a
    shared ring for both, the words through the rings too (without ``shared_x``: blocks of 8, x 3
    loads ahead) ("W4A16 decode, M <= 16, sixth pass"). Up to ten tiles an SM at M = 9-16 x's loads
    take the read-only path and the words' are not allocated in L1 (``LOADS_16``: XC 3, WC 6; "W4A16
    decode, M 9-16, ninth pass"), and the kernel is launched with programmatic dependent launch:
    ``PDL`` 3 (its blocks placed while the kernel before ends, the first groups' words asked of L2
    before the wait), 1 with the TAIL split (the wait alone: the next kernel's blocks placed early
    would crowd the multiprocessors the split halves leave) ("W4A16 decode, M 9-16, tenth pass";
    ``qkv`` keeps the default loads and launch)."""
    if m > 16:
        return WARPS, {}
    if m <= 8:
        early = {**LOADS_8, "PDL": 3} if fast else {"PDL": 3}
        if tiles <= sms:
            return 16, early
        if tiles <= 2 * sms:
            return 8, early
        if tiles <= 3 * sms:
            return 8, {**RINGS_8, "PDL": 1, **halves(8, groups, 4)}
        if tiles <= 4 * sms:
            split = halves(4, groups, 4)
            if split and tail_whole(tiles, sms, 2) < tiles:
                return 4, {**LOADS_8, **split, "PDL": 3}
            return 4, {**RINGS_8, "CS": 1, "PDL": 1, **split}
        if tiles <= 10 * sms:
            return 4, {**RINGS_8, "CS": 1, "PDL": 1}
        return (8, {**LOADS_8, "PDL": 3}) if fast else (4, {**RINGS_8, "CS": 2})
    if tiles <= sms:
        return 8, dict(SWAPPED_16)
    if tiles > 10 * sms and shared_x:
        return 4, dict(PAIRS_16 if fast else SHARED_X_16)
    if tiles <= 2 * sms or tiles > 10 * sms:
        return 8, {**SWAPPED_16, "XLEAD": 3}
    if tiles <= 3 * sms:
        return 4, {**SWAPPED_16, **halves(4, groups, 8)}
    if tiles <= 4 * sms:
        return 4, {**SWAPPED_16, "XLEAD": 3}
    if tiles <= 5 * sms:
        return 3, {**SWAPPED_16, "XLEAD": 3, "PDL": 4}
    return 4, dict(PAIRS_16)


def planned(x: _arrays.Operand, tiles: int, groups: int, shared_x: bool = True) -> tuple[int, dict]:
    """``plan`` for activations ``x`` on their GPU (its multiprocessors and memory)."""
    sms, fast = _arrays.multiprocessors(x), _arrays.fast_memory(x)
    return plan(x.shape[0], tiles, sms, groups, shared_x, fast)


def _rows(m: int) -> int:
    """ROWS, the 8-row slabs of x, for M rows: A's rows g + 8 hold data only past 8; past
    16, two per m16 tile."""
    return 1 if m <= 8 else 2 * -(-m // 16)


ALL_ROWS = tuple(sorted({_rows(m) for m in range(1, MAX_M + 1)}))  # (1, 2, 4, 6, 8)


def _mbarrier_waits(x: _arrays.Operand) -> bool:
    """Whether ``x``'s GPU waits at mbarriers (``mbarrier.try_wait``, sm_90 on): ``XS``
    needs it. The simulator does."""
    dev = _arrays.gpu(x)
    return dev is None or dev.compute_capability >= (9, 0)


def matmul(
    x: _arrays.Operand, words: _arrays.Operand, scales: _arrays.Operand, dtype=f32,
    warps: int = 0, tune: dict | None = None,
):  # fmt: skip
    """``x @ W`` in ``dtype`` (f32, f16 or bf16) [M, N] (see ``fits``): one launch, a block
    of ``warps`` warps per ``CS`` 32-column blocks (0: ``plan``'s warps and knobs); ``tune``
    overrides constexprs of ``TUNED`` (for benchmarks), ``SPLIT`` (every block's K split
    over that many), ``TAIL`` (the last partial round's blocks' K split over that many:
    ``tail_whole``) and ``PDL`` (programmatic dependent launch, on sm_90 only)."""
    m, n = x.shape[0], words.shape[1]
    tiles = -(-n // COLS)
    sms = _arrays.multiprocessors(x)
    if not warps:
        warps, chosen = planned(x, tiles, scales.shape[0], _mbarrier_waits(x))
        tune = {**chosen, **(tune or {})}
    tuned = _tuned(m, tune)
    split, tail = tuned.pop("SPLIT", SPLIT), tuned.pop("TAIL", 0)
    pdl = tuned.pop("PDL", 0) if _mbarrier_waits(x) else 0  # (griddepcontrol: sm_90)
    units = -(-tiles // tuned["CS"])
    whole = tail_whole(units, sms, tail) if tail > 1 else 0
    if tail > 1:
        split = tail if whole < units else 1
    if m > 16:
        split = 1  # a part's sums in ws are one m16 tile
    blocks = whole + (units - whole) * split if split > 1 else units
    arrays = _split_arrays(x, units - whole, split, tuned["CS"])
    out = _arrays.output(x, (m, n), dtype)
    int4_decode[_config(x, blocks, warps, tuned)](
        x.arg(), _words(words), scales.arg(), _arrays.output_arg(x, out, (m, n), dtype), m, n,
        WARPS=warps, ROWS=_rows(m), DT=dtype, **tuned, whole=whole, **arrays, SPLIT=split,
        PDL=pdl,
    )  # fmt: skip
    return out


def qkv(x: _arrays.Operand, weights: list[tuple]) -> tuple:
    """``(q, k, v)``, each ``f16(x @ W)`` for the three ``(words, scales)`` pairs of
    ``weights`` (see ``fits``): one launch, the blocks of q's columns, then k's, then v's,
    ``plan`` over the three widths' blocks (without ``RINGS_8``: blocks of 4 there; without
    ``XS``, whose blocks take two column blocks)."""
    m = x.shape[0]
    widths = [w.shape[1] for w, _ in weights]
    outs = [_arrays.output(x, (m, n), f16) for n in widths]
    blocks = sum(-(-n // COLS) for n in widths)
    sms = _arrays.multiprocessors(x)
    warps, chosen = planned(x, blocks, weights[0][1].shape[0], shared_x=False)
    chosen = {k: v for k, v in chosen.items() if k not in LOADS_16}  # unmeasured here
    warps = max(warps, 4)  # (and blocks of 3 warps)
    if m <= 8 and blocks > 2 * sms:  # where plan takes the rings (measured no faster here:
        # 70B widths, H100) or LOADS_8 (unmeasured here): main's blocks of 4
        warps, chosen = 4, ({"DEQ": 6, "XLEAD": 3} if blocks > 10 * sms else {})
    tuned = _tuned(m, chosen)
    tuned.pop("CS")  # a block per 32 columns: q's, k's and v's blocks apart
    tuned.pop("XC")
    tuned.pop("TAIL", None)  # and no K split
    int4_decode_qkv[_config(x, blocks, warps, tuned)](
        x.arg(), *(_words(w) for w, _ in weights), *(s.arg() for _, s in weights),
        *(_arrays.output_arg(x, o, (m, n)) for o, n in zip(outs, widths, strict=True)), m,
        widths[0], widths[1], WARPS=warps, ROWS=_rows(m), DT=f16, **tuned,
        **_split_arrays(x, 0, 1),
    )  # fmt: skip
    return tuple(outs)


PLANS = tuple(
    sorted(
        {
            (m, w, tuple(sorted(t.items())))
            for m in (1, 16)
            for tiles in (1, 133, 265, 397, 529, 661, 1321)
            for groups in (1, 64)
            for fast in (False, True)
            for w, t in [plan(m, tiles, 132, groups, fast=fast)]
        }
    )
)  # (M, warps, knobs) of each plan (on 132 SMs, either memory; other counts move the bounds only)


def specializations() -> list:
    """(kernel, constexprs) of every specialization ``matmul`` (f32 out: matmul_int4) and
    ``qkv`` (f16 out: qkv_project_int4, no CS) launch: each ``plan`` at M = 1 and 16 (with
    its ``PDL`` on sm_90, without before it) and blocks of 4 and 8 warps with ``TUNED``'s
    knobs, one m16 tile; 8 warps past it."""
    configs = [(m, w, dict(t)) for m, w, t in PLANS]
    configs += [(m, w, {}) for m in (1, 16) for w in (4, 8)]
    configs += [(8 * rows, WARPS, {}) for rows in ALL_ROWS if rows > 2]
    specs = []
    for kernel, dt in ((int4_decode, f32), (int4_decode_qkv, f16)):
        seen = []
        for m, warps, planned in configs:
            tune = planned
            if kernel is int4_decode_qkv:  # qkv's loads are the default ones
                tune = {k: v for k, v in planned.items() if k not in LOADS_16}
            tuned = _tuned(m, tune)
            tail = tuned.pop("TAIL", 0)
            splits = [SPLIT]
            if kernel is int4_decode:
                splits += [tail] if tail else []  # TAIL: split or not, by the grid
            elif tuned["ASYNC"] or (m <= 8 and planned.get("XC")):
                continue  # qkv keeps main's blocks of 4 where plan takes the rings or LOADS_8
            else:
                tuned.pop("CS")
                tuned.pop("XC")
            pdl = tuned.pop("PDL", 0)
            for split in splits:
                consts = {"WARPS": warps, "ROWS": _rows(m), "DT": dt, **tuned}
                if kernel is int4_decode:
                    consts["SPLIT"] = split
                for launch in ({"PDL": pdl}, {"PDL": 0}) if kernel is int4_decode else ({},):
                    if {**consts, **launch} not in seen:
                        seen.append({**consts, **launch})
                        specs.append((kernel, seen[-1]))
    return specs
