"""The deterministic fused Hopper flash-attention backward
(``kaio_ops._attention_hopper_bwd_fused``: one kernel for dK, dV and dQ, each query tile's dQ
added in a fixed key-block order through semaphores, ``kaio.wait_eq``) in the simulator
against NumPy float64 gradients at small sizes (causal and not, grouped-query heads, partial
tiles of queries and keys, both head dims and types; the simulator runs its blocks one at a
time, so a wait for a later block is reported), ``kaio.wait_eq``'s checks, the kernels' PTX
through ptxas for sm_90a, and on an sm_90 GPU against float64 autograd with the same bits
on every run."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import kaio
from kaio import f32, i32
from kaio.ptx.ptxas import assemble, find_ptxas
from kaio_ops import _arrays, attention
from kaio_ops import _attention_hopper_bwd as hopper_bwd
from kaio_ops import _attention_hopper_bwd_fused as fused
from tests.poison import poison_allocations
from tests.test_ops_attention_hopper_bwd import check_grads, run_sim, small


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every array an op allocates (the dQ sums and the semaphores too) starts poisoned."""
    poison_allocations(monkeypatch)


def _with_multiprocessors(monkeypatch, over: dict) -> dict:
    """``over`` without its "SMS": the multiprocessors the launch then sees (persistent
    blocks: a grid of that many), where it names them."""
    over = dict(over)
    if "SMS" in over:
        sms = over.pop("SMS")
        monkeypatch.setattr(_arrays, "multiprocessors", lambda like: sms)
    return over


@pytest.mark.parametrize(
    "b, h, hkv, sq, sk, d, dtype, causal, sched, early, more",
    [
        # grouped-query, partial query tiles, Sq < Sk, causal (decreasing key-block order);
        # each tile's dQ product with the next tile's S^T and dP^T; every element's mask
        # computed, lse_log2 in the kernel, P^T with dS^T
        (1, 2, 1, 152, 256, 64, np.float16, True, 1, 2, {"SPLIT": 0, "L2": 0, "PFIRST": 0}),
        # D 128, bf16, two batches, grouped-query, Sq > Sk with a partial key tile; each
        # tile's dQ product after the next tile's P^T and dS^T
        (2, 2, 1, 192, 100, 128, ml_dtypes.bfloat16, False, 2, 2, {}),
        # P^T in registers, two dQ writers; Sq > Sk, causal, grouped-query; delta computed by
        # the launch's prep from o (O)
        (1, 2, 1, 256, 128, 64, np.float16, True, 4, 3, {"O": 1}),
        # each tile's dQ product with its dV and dK (SCHED 6: the next tile's S^T and dP^T
        # meanwhile), three dS^T buffers, the masked and unmasked probabilities in two
        # branches (SPLIT), lse_log2 once a row (L2), PFIRST; causal, grouped-query, a
        # partial tile
        (1, 2, 1, 200, 128, 64, np.float16, True, 6, 3, {"SPLIT": 1, "L2": 1, "PFIRST": 1}),
        # three dS^T buffers (NDS 3), three writers, P^T before dP^T's product is awaited
        # (PFIRST), two K/V heads' key blocks interleaved in the launch order (HG 2; three
        # heads: the last group has one)
        (3, 1, 1, 128, 256, 64, np.float16, False, 4, 3, {"NDS": 3, "NW": 3, "HG": 2}),
        # rotated walks (ROT) without the semaphores (ORDER 0: the simulator runs the
        # blocks of a kernel with wait_eq in linear order, and a rotated walk waits for
        # later ones; turn_rank's turns are checked below): three key blocks whose walks
        # over two heads' four tiles begin at items 0, 2 and 5 and wrap around
        (1, 2, 1, 256, 384, 64, np.float16, False, 4, 3, {"ROT": True, "ORDER": 0}),
        # the last turn on each tile stores dQ (FINISH, with ROT): one key block, the only
        # turn (its walk over two heads' four tiles, the last partial)
        (1, 2, 1, 200, 128, 64, np.float16, False, 4, 3, {"ROT": True, "FINISH": True}),
        # persistent blocks (PERSIST; four "multiprocessors": a grid of four blocks taking
        # the nine work items from a counter, K and V in two buffers; the simulator's block 0
        # takes them all, the others find none left); grouped-query, three K/V heads' three
        # key blocks, a partial query tile (the mask's: the GPU case)
        (3, 2, 1, 200, 384, 64, np.float16, False, 4, 3, {"PERSIST": 1, "SMS": 4}),
        # the same with the mask (walks of two to eight tiles), Sq > Sk
        (2, 2, 1, 448, 384, 64, np.float16, True, 4, 3, {"PERSIST": 1, "SMS": 3}),
        # D 128's defaults with the mask (two dS^T buffers and their "free" waits), three
        # heads of one K/V head, the second key block seeing no query (Sq < Sk); delta from o
        (1, 3, 1, 120, 256, 128, np.float16, True, 4, 3, {"O": 1}),
    ],
)
def test_ordered_backward_in_simulator(
    b, h, hkv, sq, sk, d, dtype, causal, sched, early, more, monkeypatch
):  # fmt: skip
    """dQ, dK, dV against float64 through ``_attention_hopper_bwd.launch(ordered=...)``
    with two ring stages (the simulator runs the blocks in linear order: each wait is met by
    the blocks before, and a wait for a later block fails)."""
    launch = hopper_bwd.launch
    more = _with_multiprocessors(monkeypatch, more)
    with_o = bool(more.pop("O", 0))  # (the launch's prep writes delta from o)
    over = {"SCHED": sched, "EARLY": early, "STAGES": 2, **more}
    monkeypatch.setattr(hopper_bwd, "launch", lambda *a, **k: launch(*a, **k, ordered=over))
    cfg = small(2, 0, 0, 5, 0)
    check_grads(*run_sim(b, h, hkv, sq, sk, d, dtype, causal, cfg, with_o=with_o), dtype)


def test_launch_dispatches_by_head_dim_and_mask(monkeypatch):
    """``_attention_hopper_bwd.launch`` runs the ordered kernel where ``takes`` says so
    (``ORDERED`` by head dim and mask) and the caller asks for nothing of the other kernels'
    (``cfg``, ``fused``, ``side``), or where ``ordered`` asks."""
    monkeypatch.setattr(fused, "ORDERED", {64: (False, True), 128: (True, True)})
    assert fused.takes(128, False) and fused.takes(64, True) and not fused.takes(64, False)
    assert not fused.takes(256, True)
    monkeypatch.setattr(fused, "launch", lambda *a: ("ordered", a[9]))  # (cfg: its overrides)
    q = np.zeros((1, 1, 128, 64), np.float16)
    with kaio.simulate():
        inputs = _arrays.Inputs("test")
        (qa, ka, va), dims, scale = attention._check_flash("test", q, q, q, None, inputs)
        la = inputs.array(np.zeros((1, 1, 128), np.float32), "lse", ndim=3, dtypes=(f32,))
        args = (qa, ka, va, qa, la, np.zeros(128, np.float32), dims)
        assert hopper_bwd.launch(*args, True, scale) == ("ordered", None)
        assert hopper_bwd.launch(*args, True, scale, deterministic=True)[0] == "ordered"
        over = {"SCHED": 4}
        assert hopper_bwd.launch(*args, False, scale, ordered=over) == ("ordered", over)
        for causal, keywords in ((False, {}), (True, {"side": False}), (True, {"fused": False})):
            with pytest.raises(KeyError):  # not taken: the pair's configuration is read
                hopper_bwd.launch(*args, causal, scale, cfg={"bad": 1}, **keywords)


@kaio.gpu_kernel(block_size=32)
def _rotated_turns(out: i32[:], nkb: i32, total: i32):
    """out[x * total + item] = key block x's turn on item ``item`` of the rotated walks."""
    x = i32(kaio.block_idx_x())
    item = i32(kaio.thread_idx_x())
    if item < total:
        out[x * total + item] = fused.turn_rank(x, nkb, 0, item, total, 0, 1, 64, 128)


@pytest.mark.parametrize("nkb, total", [(3, 8), (8, 16), (5, 3), (4, 4), (7, 32)])
def test_rotated_turns_follow_the_walks(nkb, total):
    """``turn_rank`` with ``rot``: on each item the key blocks take their turns in the
    order their rotated walks (key block x's from item x total // nkb) reach it, ties to the
    later key block: a permutation, and a block never waits for one that reaches the item
    later (no block waits long when they run alike)."""
    out = np.full(nkb * total, -1, np.int32)
    _rotated_turns.sim[nkb, 32](out, nkb, total)
    turns = out.reshape(nkb, total)
    for item in range(total):
        steps = [((item - x * total // nkb) % total, -x) for x in range(nkb)]
        assert list(turns[:, item]) == [sorted(steps).index(s) for s in steps], (item, turns)


def _fragment_order(d: int) -> np.ndarray:
    """The position in a 64 x d tile of ``dq_acc`` (``store_dq_frags``' fragment order) of
    each element (r, c), from the wgmma accumulator layout: [64, d]."""
    r, c = np.meshgrid(np.arange(64), np.arange(d), indexing="ij")
    lane = 32 * (r // 16) + 4 * (r % 8) + c % 8 // 2
    return (c // 8 * 128 + lane) * 4 + r % 16 // 8 * 2 + c % 2


@pytest.mark.parametrize(
    "d, sq, heads, causal, nkb, dtype",
    [(64, 100, 2, 0, 3, np.float16), (128, 192, 2, 1, 2, ml_dtypes.bfloat16),
     (64, 256, 1, 1, 2, np.float16)],
)  # fmt: skip
def test_dq_conversions_against_the_fragment_order(d, sq, heads, causal, nkb, dtype):
    """``dq_convert_rows`` and ``dq_convert_behind`` (its semaphores counting every turn:
    ``tile_turns``; one short is reported) turn ``dq_acc``'s whole 64-row tiles in fragment
    order into dQ's rows (a partial last tile's rows past sq left alone) times the scale."""
    nt = -(-sq // 64)
    acc = np.random.default_rng(d + sq).standard_normal(heads * nt * 64 * d).astype(np.float32)
    tiles = acc.reshape(heads, nt, 64 * d)[:, :, _fragment_order(d)]  # [heads, nt, 64, d]
    want = (tiles.reshape(heads, nt * 64, d)[:, :sq] * 0.5).astype(dtype).reshape(-1)
    dt = kaio.bf16 if dtype is ml_dtypes.bfloat16 else kaio.f16
    rows = np.full(heads * sq * d, np.nan, dtype)
    behind = rows.copy()
    fused.dq_convert_rows.sim[heads * nt, 256](rows, acc, sq, 0.5, D=d, DT=dt)
    turns = [min(nkb - 1, ((t % nt + 1) * 64 - 1) // 128) + 1 if causal else nkb
             for t in range(heads * nt)]  # fmt: skip
    sem = np.array(turns, np.int32)
    fused.dq_convert_behind.sim[heads * nt, 256](behind, acc, sem, sq, nkb, causal, 0.5, D=d,
                                                 BK=128, DT=dt)  # fmt: skip
    assert np.array_equal(rows, want) and np.array_equal(behind, want)
    sem[-1] -= 1  # the last tile's last turn not in: its wait is never met
    with pytest.raises(kaio.SimulationError, match="wait_eq"):
        fused.dq_convert_behind.sim[heads * nt, 256](behind, acc, sem, sq, nkb, causal, 0.5,
                                                     D=d, BK=128, DT=dt)  # fmt: skip


@kaio.gpu_kernel(block_size=32)
def _take_turns(sem: i32[:], out: f32[:], first: i32):
    """Block b waits for sem[0] == b + first, then out[b] = its turn's number."""
    b = i32(kaio.block_idx_x())
    if kaio.thread_idx_x() == 0:
        kaio.wait_eq(sem, 0, b + first)
        out[b] = f32(kaio.atomic_add(sem, 0, 1))


def test_wait_eq_in_the_simulator_runs_blocks_in_order_and_reports_an_unmet_wait():
    sem, out = np.zeros(1, np.int32), np.full(5, np.nan, np.float32)
    _take_turns.sim[5](sem, out, 0)
    assert sem[0] == 5 and (out == np.arange(5)).all()
    sem[0] = 0  # block 0 waits for 1: only a later block could store it
    with pytest.raises(kaio.SimulationError, match="wait_eq.*holds 0"):
        _take_turns.sim[5](sem, out, 1)


def test_wait_eq_refuses_shared_and_float_arrays():
    @kaio.gpu_kernel(block_size=32)
    def shared_wait(out: i32[:]):
        s = kaio.shared(i32, (1,))
        kaio.wait_eq(s, 0, 1)

    @kaio.gpu_kernel(block_size=32)
    def float_wait(x: f32[:]):
        kaio.wait_eq(x, 0, 1.0)

    with pytest.raises(kaio.CompileError, match="global array"):
        shared_wait.ptx(arch="sm_90")
    with pytest.raises(kaio.CompileError, match="i32 or u32"):
        float_wait.ptx(arch="sm_90")


SHIPPED = [(k, c) for k, c in fused.specializations() if c.get("DT") != kaio.bf16]


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
@pytest.mark.parametrize("index", range(len(SHIPPED)))
def test_specializations_assemble_for_sm_90a(index):
    """No spills, no serialized wgmma (f16: bf16 differs in the wgmma's type only); the SIMT
    kernels without programmatic dependent launch (sm_90's) for sm_80 too."""
    kernel, constexprs = SHIPPED[index]
    ptx = kernel.ptx(arch="sm_90", **constexprs)
    hopper = ".target sm_90a" in ptx
    report = assemble(ptx, "sm_90a" if hopper else "sm_90")
    spills = re.search(r"(\d+) bytes spill stores", report)
    assert spills and spills[1] == "0", (constexprs, report)
    assert "C7518" not in report and "C7508" not in report and "C7510" not in report, report
    if not hopper and "griddepcontrol" not in ptx:
        assemble(kernel.ptx(arch="sm_80", **constexprs), "sm_80")


# --------------------------------------------------------------------------- GPU


def _hopper_gpu() -> bool:
    return kaio.gpu_available() and kaio.device().arch == "sm_90"


def _gpu_operands(b, h, hkv, sq, sk, d, causal, seed):
    """Random f16 q, k, v, do on the GPU, the forward's o and lse (in float64: no forward
    kernel to compile), and ``launch``'s checked operands: (q, k, v, do, run) with
    ``run(**keywords)`` the backward's (dq, dk, dv)."""
    import torch

    from bench.attention_hopper_bwd import forward_ref

    gen = torch.Generator(device="cuda").manual_seed(seed)
    shapes = [(b, heads, rows, d) for heads, rows in ((h, sq), (hkv, sk), (hkv, sk), (h, sq))]
    q, k, v, do = [torch.randn(x, generator=gen, device="cuda").half() for x in shapes]
    o, lse = forward_ref(q, k, v, causal)
    inputs = _arrays.Inputs("test")
    (qa, ka, va), dims, scale = attention._check_flash("test", q, k, v, None, inputs)
    da = inputs.array(do, "do", ndim=4)
    la = inputs.array(lse, "lse", ndim=3, dtypes=(f32,))
    oa = inputs.array(o, "o", ndim=4)
    delta = (o.float() * do.float()).sum(-1).reshape(-1)

    def run(with_o=False, **keywords):
        o_arg = oa if with_o else None  # (given: prep computes delta from it)
        return hopper_bwd.launch(qa, ka, va, da, la, delta, dims, causal, scale, **keywords,
                                 o=o_arg)  # fmt: skip

    return q, k, v, do, run


@pytest.mark.gpu
@pytest.mark.skipif("not _hopper_gpu()", reason="needs an sm_90 GPU")
@pytest.mark.parametrize(
    "d, causal, hkv, over",
    [(128, True, 2, {}), (128, False, 4, {}), (64, True, 4, {}), (64, False, 3, {}),
     (64, False, 3, {"ROT": True}), (64, True, 4, {"ROT": True}),
     (64, False, 3, {"ROT": True, "FINISH": True}), (64, False, 3, {"PERSIST": 1, "SMS": 7}),
     (64, True, 4, {"PERSIST": 1, "SMS": 7}),
     (128, False, 4, {"ROT": True, "FINISH": True}), (128, True, 2, {"ROT": True})],
)  # fmt: skip
def test_gpu_ordered_backward_is_right_and_deterministic(d, causal, hkv, over, monkeypatch):
    """Against float64 autograd (grouped-query heads, Sq < Sk, a partial query tile) and
    the same bits on three runs, at a size with many key blocks a query tile (three K/V
    heads: six blocks' heads, a partial group of ``HG``); ``over``: with ``ROT`` (rotated
    walks, resp. the longest causal walks launched first), ``FINISH`` (with rotated walks)
    and ``PERSIST`` (persistent blocks; ``SMS``: the multiprocessors the launch sees, so
    that each block runs several work items)."""
    import torch

    over = _with_multiprocessors(monkeypatch, over)

    from tests.test_ops_attention import _rel_t, _sdpa64

    h = 6 if hkv == 3 else 4
    q, k, v, do, run = _gpu_operands(2, h, hkv, 1000, 2048, d, causal, d + hkv)
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    _sdpa64(*leaves, causal, group=h // hkv).backward(do.double())
    runs = [run(ordered=over or True) for _ in range(3)]
    for g, leaf in zip(runs[0], leaves, strict=True):
        assert _rel_t(g, leaf.grad) < 5e-3, _rel_t(g, leaf.grad)
    for again in runs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(runs[0], again, strict=True))


@pytest.mark.gpu
@pytest.mark.skipif("not _hopper_gpu()", reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d, causal", [(128, False), (128, True), (64, False), (64, True)])
def test_gpu_ordered_backward_replays_in_a_cuda_graph(d, causal):
    """Captured in a CUDA graph, replayed twice: the semaphores are zeroed inside the
    captured work, so each replay equals the eager call bit for bit (a replay that found
    the last call's counts would wait forever or add out of order, and D 64's persistent
    blocks would find no work item left); the defaults with o given (as
    ``flash_attention_bwd`` calls it)."""
    import torch

    *_, run = _gpu_operands(1, 4, 4, 1024, 1024, d, causal, 5)
    eager = run(True, ordered=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(True, ordered=True)
    for _ in range(2):
        for g in captured:
            g.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(x, y) for x, y in zip(eager, captured, strict=True))
