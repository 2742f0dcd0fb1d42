"""Rounds only (bwd64): the ordered backward's preprocessing kernels alone, main's
(row_dot_vec + zero_acc_sem_l2; dq_convert_tiles) against the branch's (prep with R rows a
lane; dq_convert_wide), f16 B16 H16 S1024, D 64 and 128, queued behind a GPU sleep."""

import importlib.util
import statistics
import sys

import torch

from kaio import f16
from kaio_ops import _attention_hopper_bwd as H
from kaio_ops import _attention_hopper_bwd_fused as F
from kaio_ops import _attention_tc as tc

sp = importlib.util.spec_from_file_location("main_fused", "bench/ab_main/_attention_hopper_bwd_fused.py")
M = importlib.util.module_from_spec(sp)
sp.loader.exec_module(M)
dev = "cuda"
st = torch.cuda.current_stream().cuda_stream
RS = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,2,4").split(",")]
for d in (64, 128):
    bh, sq = 256, 1024
    rows = bh * sq
    g = torch.Generator(device=dev).manual_seed(d)
    o = torch.randn(rows * d, device=dev, dtype=torch.float16, generator=g)
    do = torch.randn(rows * d, device=dev, dtype=torch.float16, generator=g)
    lse = torch.randn(rows, device=dev, dtype=torch.float32, generator=g)
    m = bh * 16
    acc = torch.randn(rows * d, device=dev, dtype=torch.float32, generator=g)
    dummy = torch.empty(4, device=dev, dtype=torch.float32)
    outs = {}

    def buf(name, n, dt=torch.float32):
        return outs.setdefault(name, torch.ones(n, device=dev, dtype=dt))

    def old():
        L = tc.row_lanes(d)
        tc.row_dot_vec[-(-rows * L // 256), 256, st, 0](o, do, buf("od", rows), rows, d, L=L, DT=f16)
        M.zero_acc_sem_l2[-(-rows // 256), 256, st, 0](dummy, 0, buf("os", m, torch.int32), m, lse,
                                                       buf("ol", rows), rows)

    def new(R, mod=F, tag=""):  # noqa
        def f():
            per = F.prep_rows(d, R)
            mod.prep[max(-(-rows // per), -(-m // 256)), 256, st, 0](
                o, do, buf(f"nd{R}{tag}", rows), lse, buf(f"nl{R}{tag}", rows), rows, dummy, 0,
                buf(f"ns{R}{tag}", m, torch.int32), m, D=d, R=R, DOT=1, DT=f16)
        return f

    def conv_old():
        H.dq_convert_tiles[-(-rows * d // 1024), 256, st, 0](buf("co", rows * d, torch.float16), acc,
                                                            rows, sq, 0.125, D=d, DT=f16)

    def conv_new(t):
        def f():
            F.dq_convert_rows[-(-rows // 64 // t), 256, st, 0](
                buf(f"cn{t}", rows * d, torch.float16), acc, rows // 64, sq, 0.125, T=t, D=d,
                DT=f16)
        return f

    big = torch.cat([o, do])
    a16 = torch.empty(rows * d, device=dev, dtype=torch.float16)
    fns = {"old prep": old, **{f"prep R{R}": new(R) for R in RS}, "conv old": conv_old,
           **{f"conv rows T{t}": conv_new(t) for t in ((1, 2, 4) if d == 64 else (1, 2))},
           "torch sum o,do": lambda: big.sum(),
           "torch acc to f16": lambda: a16.copy_(acc)}
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    ref = (o.view(rows, d).double() * do.view(rows, d).double()).sum(1)
    err = {k: (outs[k].double() - ref).abs().max().item() for k in outs if k.startswith(("od", "nd"))}
    same = [torch.equal(outs[f"nl{R}"], outs["ol"]) and int(outs[f"ns{R}"].abs().sum()) == 0 for R in RS]
    print(f"D{d} delta max err {err}; l2 equal, sem 0: {same}; conv equal {[torch.equal(outs['co'], outs[k]) for k in outs if k.startswith('cn')]}",
          flush=True)
    times = {k: [] for k in fns}
    for _ in range(7):
        for k, f in fns.items():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)
            s.record()
            for _ in range(10):
                f()
            e.record()
            e.synchronize()
            times[k].append(s.elapsed_time(e) * 100)
    print(f"{torch.cuda.get_device_name()} D{d} rows {rows}: us a call (median of 7 x 10, queued): "
          + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in times.items()), flush=True)
