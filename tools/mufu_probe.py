"""Dump the GPU's approximate f32 math (ex2/lg2/rsqrt/rcp/sin/cos/tanh.approx, div.full) on
structured and random inputs, through raw PTX and the driver (no kaio), for the simulator's
bit-exact models (kaio/sim/mufu.py). Run on a GPU box (numpy, torch):
``MUFU_ROUND=A PYTHONPATH=. python3 tools/mufu_probe.py OUTDIR`` (A: the bands that
tools/mufu_tables.py turns into rcp/rsqrt/ex2/lg2 tables; B: sin/cos on one x per 2^-25 turn,
tanh bands; C: every instruction against kaio.sim.mufu over 2^24 inputs spread over all bit
patterns). Each round takes 10 to 30 s on an H100."""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

T0 = time.time()

HEAD = """.version 7.8
.target sm_90
.address_size 64
"""

RANGE = """.visible .entry k(.param .u64 p_out, .param .u32 p_base, .param .u32 p_n)
{
 .reg .pred %p; .reg .b32 %r<8>; .reg .f32 %f<4>; .reg .b64 %rd<4>;
 mov.u32 %r1, %ctaid.x; mov.u32 %r2, %ntid.x; mov.u32 %r3, %tid.x;
 mad.lo.u32 %r4, %r1, %r2, %r3;
 ld.param.u32 %r5, [p_n]; setp.ge.u32 %p, %r4, %r5; @%p bra DONE;
 ld.param.u32 %r6, [p_base]; add.u32 %r7, %r6, %r4; mov.b32 %f1, %r7;
 OP
 ld.param.u64 %rd1, [p_out]; cvta.to.global.u64 %rd1, %rd1;
 mul.wide.u32 %rd2, %r4, 4; add.u64 %rd3, %rd1, %rd2;
 st.global.f32 [%rd3], %f2;
DONE: ret;
}
"""

ARRAY = """.visible .entry k(.param .u64 p_out, .param .u64 p_a, .param .u64 p_b, .param .u32 p_n)
{
 .reg .pred %p; .reg .b32 %r<8>; .reg .f32 %f<4>; .reg .b64 %rd<8>;
 mov.u32 %r1, %ctaid.x; mov.u32 %r2, %ntid.x; mov.u32 %r3, %tid.x;
 mad.lo.u32 %r4, %r1, %r2, %r3;
 ld.param.u32 %r5, [p_n]; setp.ge.u32 %p, %r4, %r5; @%p bra DONE;
 mul.wide.u32 %rd2, %r4, 4;
 ld.param.u64 %rd1, [p_a]; cvta.to.global.u64 %rd1, %rd1; add.u64 %rd3, %rd1, %rd2;
 ld.global.f32 %f1, [%rd3];
 ld.param.u64 %rd4, [p_b]; cvta.to.global.u64 %rd4, %rd4; add.u64 %rd5, %rd4, %rd2;
 ld.global.f32 %f3, [%rd5];
 OP
 ld.param.u64 %rd6, [p_out]; cvta.to.global.u64 %rd6, %rd6; add.u64 %rd7, %rd6, %rd2;
 st.global.f32 [%rd7], %f2;
DONE: ret;
}
"""

UNARY = [
    "ex2.approx.ftz.f32",
    "ex2.approx.f32",
    "lg2.approx.ftz.f32",
    "lg2.approx.f32",
    "rsqrt.approx.ftz.f32",
    "rsqrt.approx.f32",
    "rcp.approx.ftz.f32",
    "rcp.approx.f32",
    "sin.approx.ftz.f32",
    "sin.approx.f32",
    "cos.approx.ftz.f32",
    "cos.approx.f32",
    "tanh.approx.f32",
]
BINARY = ["div.full.ftz.f32", "div.full.f32", "mul.ftz.f32", "mul.rz.ftz.f32"]


def fbits(v: float) -> int:
    """The f32 bits of v."""
    return int(np.array(v, np.float32).view(np.uint32))


def ordered(bits: np.ndarray) -> np.ndarray:
    """f32 bits as int64 keys ordered like the values."""
    b = bits.astype(np.int64)
    mag = b & 0x7FFFFFFF
    return np.where(b >> 31 != 0, -mag, mag)


def main() -> None:
    """Run one round's experiments (``MUFU_ROUND``: A, B or C) and write them to argv[1]."""
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    if os.environ.get("MUFU_FAKE"):
        dev, cc = "fake", (0, 0)
    else:
        import torch

        cuda = ctypes.CDLL("libcuda.so.1")
        torch.zeros(1, device="cuda")
        dev = torch.cuda.get_device_name()
        cc = torch.cuda.get_device_capability()
    meta: dict = {"device": dev, "cc": list(cc), "files": {}}
    print("device", dev, cc, f"{time.time() - T0:.1f}s", flush=True)

    funcs = {}

    def kernel(op: str, kind: str):
        key = (op, kind)
        if key not in funcs:
            body = (RANGE if kind == "range" else ARRAY).replace(
                "OP", f"{op} %f2, %f1;" if kind != "binary" else f"{op} %f2, %f1, %f3;"
            )
            mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
            image = ctypes.c_char_p((HEAD + body).encode())
            err = cuda.cuModuleLoadData(ctypes.byref(mod), image)
            assert err == 0, (op, err)
            err = cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"k")
            assert err == 0, (op, err)
            funcs[key] = fn
        return funcs[key]

    def launch(fn, n, args, types):
        vals = [t(a) for a, t in zip(args, types, strict=True)]
        ptrs = (ctypes.c_void_p * len(vals))(
            *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in vals]
        )
        g = ctypes.c_uint
        err = cuda.cuLaunchKernel(
            fn,
            g((n + 255) // 256),
            g(1),
            g(1),
            g(256),
            g(1),
            g(1),
            g(0),
            ctypes.c_void_p(0),
            ptrs,
            ctypes.c_void_p(0),
        )
        assert err == 0, err

    def run_range(op: str, base: int, n: int) -> np.ndarray:
        out = torch.empty(n, dtype=torch.int32, device="cuda")
        launch(
            kernel(op, "range"),
            n,
            (out.data_ptr(), base, n),
            (ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32),
        )
        return out.cpu().numpy().view(np.uint32)

    def run_array(op: str, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        n = len(a)
        ta = torch.from_numpy(a.view(np.int32)).cuda()
        tb = torch.from_numpy((a if b is None else b).view(np.int32)).cuda()
        out = torch.empty(n, dtype=torch.int32, device="cuda")
        kind = "unary" if b is None else "binary"
        launch(
            kernel(op, kind),
            n,
            (out.data_ptr(), ta.data_ptr(), tb.data_ptr(), n),
            (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32),
        )
        return out.cpu().numpy().view(np.uint32)

    if os.environ.get("MUFU_FAKE"):  # a dry run without a GPU: float64 math for the GPU

        def fake(op, x):
            f = {
                "ex2": np.exp2,
                "lg2": np.log2,
                "rsqrt": lambda v: 1 / np.sqrt(v),
                "rcp": lambda v: 1 / v,
                "sin": np.sin,
                "cos": np.cos,
                "tanh": np.tanh,
            }
            with np.errstate(all="ignore"):
                return (
                    f[op.split(".")[0]](x.view(np.float32).astype(np.float64))
                    .astype(np.float32)
                    .view(np.uint32)
                )

        def run_range(op, base, n):  # noqa: F811
            return fake(op, (np.arange(n, dtype=np.uint64) + base).astype(np.uint32))

        def run_array(op, a, b=None):  # noqa: F811
            if b is not None:
                return (a.view(np.float32) / b.view(np.float32)).view(np.uint32)
            return fake(op, a)

    pool = ThreadPoolExecutor(16)
    pending = []

    def write(name: str, arr: np.ndarray, **info):
        blob = zlib.compress(np.ascontiguousarray(arr).tobytes(), 6)
        with open(os.path.join(out_dir, name + ".z"), "wb") as f:
            f.write(blob)
        info = {"dtype": str(arr.dtype), "n": int(arr.size), "bytes": len(blob), **info}
        with open(os.path.join(out_dir, name + ".json"), "w") as f:
            json.dump(info, f)
        return name, info

    def save(name: str, arr: np.ndarray, **info) -> None:
        pending.append(pool.submit(write, name, arr, **info))

    refs = {
        "ex2": np.exp2,
        "lg2": np.log2,
        "rsqrt": lambda x: 1.0 / np.sqrt(x),
        "rcp": lambda x: 1.0 / x,
        "sin": np.sin,
        "cos": np.cos,
        "tanh": np.tanh,
    }

    def band(op: str, lo: float, hi: float, tag: str) -> None:
        """All f32 inputs in [lo, hi) (lo, hi of one sign, lo < hi in magnitude order)."""
        if time.time() - T0 > 26:
            print("skipped", tag, flush=True)
            return
        b0, b1 = fbits(lo), fbits(hi)
        base, n = min(b0, b1), abs(b1 - b0)
        hw = run_range(op, base, n)

        def work():
            x = (np.arange(n, dtype=np.uint64) + base).astype(np.uint32).view(np.float32)
            fn = refs[op.split(".")[0]]
            with np.errstate(all="ignore"):
                ref = fn(x.astype(np.float64)).astype(np.float32).view(np.uint32)
            d = ordered(hw) - ordered(ref)
            lo_d, hi_d = int(d.min()), int(d.max())
            diff = False
            if not (-128 <= lo_d and hi_d < 128):
                dd = np.diff(d, prepend=0)
                if int(np.abs(dd).max()) < int(max(-lo_d, hi_d)):
                    d, diff = dd, True
            m = int(np.abs(d).max())
            dt = (
                np.int8
                if m < 128
                else np.int16
                if m < 32768
                else np.int32
                if m < 2**31
                else np.int64
            )
            return write(
                tag,
                d.astype(dt),
                op=op,
                base=base,
                min=lo_d,
                max=hi_d,
                diff=diff,
                crc=zlib.crc32(hw.tobytes()),
                kind="band",
            )

        pending.append(pool.submit(work))

    if os.environ.get("MUFU_ROUND") == "C":
        round_c(run_array, save)
    elif os.environ.get("MUFU_ROUND") == "B":
        round_b(band, run_array, save)
    else:
        round_a(band, run_array, save)
    for f in pending:
        name, info = f.result()
        meta["files"][name] = info
    meta["seconds"] = time.time() - T0
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    total = sum(i["bytes"] for i in meta["files"].values())
    print(f"{'file':24} {'dtype':6} {'min':>8} {'max':>8} {'bytes':>9}")
    for name, info in meta["files"].items():
        print(
            f"{name:24} {info['dtype']:6} {info.get('min', ''):>8} {info.get('max', ''):>8} "
            f"{info['bytes']:>9}"
        )
    print(f"total {total} bytes, {meta['seconds']:.1f}s on {dev}")


def rz_turns(x: np.ndarray) -> np.ndarray:
    """FMUL.RZ(x, 1/(2 pi) as f32) in float64: the exact product truncated to f32."""
    c = np.float64(np.float32(0.15915493667125701904))
    exact = x.astype(np.float32).astype(np.float64) * c
    near = exact.astype(np.float32)
    away = np.abs(near.astype(np.float64)) > np.abs(exact)
    return np.where(away, np.nextafter(near, np.float32(0)), near)


def round_b(band, run_array, save) -> None:
    """sin/cos on crafted inputs: one x per 2^-25 step of the turns in [0, 1/2); tanh bands."""
    n = 2**24
    q = np.arange(n, dtype=np.int64)
    target = q.astype(np.float64) * 2.0**-25
    c = np.float64(np.float32(0.15915493667125701904))
    best = np.zeros(n, np.uint32)
    found = np.zeros(n, bool)
    for turn in (0, 1):  # some steps are reached only from x in [2 pi, 3 pi)
        x0 = ((target + turn) / c).astype(np.float32)
        for j in (0, 1, -1, 2, -2, 3, -3):
            xj = (x0.view(np.uint32).astype(np.int64) + j).astype(np.uint32)
            with np.errstate(all="ignore"):
                r = rz_turns(xj.view(np.float32)).astype(np.float64) - turn
            qj = np.trunc(r * 2.0**25).astype(np.int64)
            hit = (qj == q) & ~found
            best[hit] = xj[hit]
            found |= hit
    print("sin inputs found", int(found.sum()), "of", n, f"{time.time() - T0:.1f}s", flush=True)
    save("sc_found", found.astype(np.uint8), kind="mask")
    for op in ("sin.approx.ftz.f32", "cos.approx.ftz.f32"):
        hw = run_array(op, best)
        tag = op.split(".")[0]
        for part in range(4):
            s = slice(part * n // 4, (part + 1) * n // 4)
            save(f"sc_{tag}_{part}", hw[s], kind="raw")
    for k in range(-14, 4):
        band("tanh.approx.f32", 2.0**k, 2.0 ** (k + 1), f"tanh_{k}")
    band("tanh.approx.f32", -1.0, -2.0, "tanh_m1")


def round_c(run_array, save) -> None:
    """Every instruction against kaio.sim.mufu over 2^24 inputs spread over all 2^32 bit
    patterns (each 256-block once, at a hashed offset) and random division pairs."""
    sys.path.insert(0, os.getcwd())
    from kaio.sim import mufu

    k = np.arange(1 << 24, dtype=np.uint64)
    salt = np.uint64(int(os.environ.get("MUFU_SALT", "0")))  # another offset in each block
    low = (((k + salt) * np.uint64(2654435761)) >> np.uint64(24)) & np.uint64(255)
    xs = ((k << np.uint64(8)) | low).astype(np.uint32)
    models = {
        "ex2.approx.ftz.f32": mufu.ex2,
        "ex2.approx.f32": lambda v: mufu.ex2(v, False),
        "lg2.approx.ftz.f32": mufu.lg2,
        "lg2.approx.f32": lambda v: mufu.lg2(v, False),
        "rsqrt.approx.ftz.f32": mufu.rsqrt,
        "rsqrt.approx.f32": lambda v: mufu.rsqrt(v, False),
        "rcp.approx.ftz.f32": mufu.rcp,
        "rcp.approx.f32": lambda v: mufu.rcp(v, False),
        "sin.approx.ftz.f32": mufu.sin,
        "sin.approx.f32": mufu.sin,
        "cos.approx.ftz.f32": mufu.cos,
        "cos.approx.f32": mufu.cos,
    }
    for name in ("rcp", "rsqrt", "ex2_pos", "ex2_neg", "lg2_pos", "lg2_neg", "sincos"):
        mufu.table(name)
    print("tables", f"{time.time() - T0:.1f}s", flush=True)
    pool = ThreadPoolExecutor(16)
    chunk = 1 << 20

    def model_bits(fn, *args):
        def part(i):
            with np.errstate(all="ignore"):
                r = fn(*(a[i : i + chunk].view(np.float32) for a in args)).view(np.uint32)
            return np.where(np.isnan(r.view(np.float32)), np.uint32(0x7FFFFFFF), r)

        return np.concatenate(list(pool.map(part, range(0, len(args[0]), chunk))))

    summary = []
    for op, fn in models.items():
        if time.time() - T0 > float(os.environ.get("MUFU_BUDGET", "30")):
            summary.append((op, "skipped (time)"))
            continue
        hw = run_array(op, xs)
        bad = np.nonzero(model_bits(fn, xs) != hw)[0]
        summary.append((op, f"{len(bad)} of {len(xs)}"))
        for i in bad[:4]:
            print(f"  {op} x={xs[i]:#010x} gpu {hw[i]:#010x}", flush=True)
        save("sweep_bad_" + op.replace(".", "_"), xs[bad[:10000]], kind="bad")
    rng = np.random.default_rng(33)
    a = rng.integers(0, 2**32, 1 << 23, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2**32, 1 << 23, dtype=np.uint64).astype(np.uint32)
    b[: 1 << 22] = (
        (rng.choice([-1, 1], 1 << 22) * 2.0 ** rng.uniform(-130, 128, 1 << 22))
        .astype(np.float32)
        .view(np.uint32)
    )
    hw = run_array("div.full.ftz.f32", a, b)
    bad = np.nonzero(model_bits(mufu.div_full_ftz, a, b) != hw)[0]
    summary.append(("div.full.ftz.f32", f"{len(bad)} of {len(a)}"))
    for i in bad[:4]:
        print(f"  div a={a[i]:#010x} b={b[i]:#010x} gpu {hw[i]:#010x}", flush=True)
    print(f"{'instruction':22} mismatches")
    for op, s in summary:
        print(f"{op:22} {s}")


def round_a(band, run_array, save) -> None:
    """Bands of every MUFU operation's reduced domain, random inputs, division pairs."""
    # Structured bands (pure MUFU for the .ftz forms; sin/cos include FMUL.RZ by 1/(2 pi)).
    band("rcp.approx.ftz.f32", 1.0, 2.0, "rcp_1_2")
    band("rsqrt.approx.ftz.f32", 1.0, 4.0, "rsqrt_1_4")
    band("rsqrt.approx.ftz.f32", 2.0**40, 2.0**42, "rsqrt_2p40")
    for lo, tag in [(0.5, "0p5"), (1.0, "1"), (2.0, "2"), (2.0**60, "2p60")]:
        band("lg2.approx.ftz.f32", lo, 2 * lo, f"lg2_{tag}")
    band("lg2.approx.ftz.f32", 2.0**-60, 2.0**-59, "lg2_2m60")
    for lo, tag in [
        (1.0, "1"),
        (0.5, "0p5"),
        (0.25, "0p25"),
        (2.0, "2"),
        (2.0**-20, "2m20"),
        (64.0, "64"),
        (-1.0, "m1"),
        (-0.5, "m0p5"),
        (-2.0, "m2"),
        (-64.0, "m64"),
    ]:
        band("ex2.approx.ftz.f32", lo, 2 * lo, f"ex2_{tag}")
    for lo, tag in [
        (1.0, "1"),
        (2.0, "2"),
        (4.0, "4"),
        (0.5, "0p5"),
        (2.0**-10, "2m10"),
        (1024.0, "1024"),
    ]:
        band("sin.approx.ftz.f32", lo, 2 * lo, f"sin_{tag}")
        if tag in ("1", "0p5", "1024"):
            band("cos.approx.ftz.f32", lo, 2 * lo, f"cos_{tag}")
    print("bands done", f"{time.time() - T0:.1f}s", flush=True)

    # Random bit patterns plus specials for every instruction (raw output bits).
    rng = np.random.default_rng(32)
    specials = [
        0,
        0x80000000,
        1,
        0x80000001,
        0x007FFFFF,
        0x807FFFFF,
        0x00800000,
        0x80800000,
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0xFFC00000,
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x3F800000,
        0xBF800000,
        0x40000000,
        0x42FE0000,
        0xC2FC0000,
        0xC3000000,
    ]
    xs = np.concatenate(
        [
            np.array(specials, np.uint32),
            rng.integers(0, 2**32, 2**18 - len(specials), dtype=np.uint64).astype(np.uint32),
        ]
    )
    save("rand_in", xs, kind="input")
    for op in UNARY:
        save("rand_" + op.replace(".", "_"), run_array(op, xs), op=op, kind="rand")
    # Moderate-range inputs (where the functions are interesting).
    mags = rng.uniform(-30, 30, 2**18)
    xm = (np.sign(rng.standard_normal(2**18)) * 2.0**mags).astype(np.float32).view(np.uint32)
    save("mid_in", xm, kind="input")
    for op in UNARY:
        save("mid_" + op.replace(".", "_"), run_array(op, xm), op=op, kind="mid")
    # Binary: division pairs, and the multiply forms that div.full might use.
    a = (rng.uniform(-1, 1, 2**18) * 2.0 ** rng.uniform(-140, 130, 2**18)).astype(np.float32)
    b = (rng.uniform(-1, 1, 2**18) * 2.0 ** rng.uniform(-140, 130, 2**18)).astype(np.float32)
    a[:1000] = rng.uniform(1, 2, 1000)
    b[:1000] = rng.uniform(1, 2, 1000)
    save("div_a", a.view(np.uint32), kind="input")
    save("div_b", b.view(np.uint32), kind="input")
    for op in BINARY:
        save(
            "div_" + op.replace(".", "_"),
            run_array(op, a.view(np.uint32), b.view(np.uint32)),
            op=op,
            kind="binary",
        )
    save("div_rcp", run_array("rcp.approx.ftz.f32", b.view(np.uint32)), kind="rcp_of_b")


if __name__ == "__main__":
    main()
