"""Build the simulator's MUFU tables (kaio/sim/data/mufu_*.npz) from tools/mufu_probe.py's dumps
of an H100: ``PYTHONPATH=. python3 tools/mufu_tables.py PROBE_DIR [NAME ...]``."""

from __future__ import annotations

import json
import os
import sys
import zlib

import numpy as np

from kaio.sim import mufu


def _raw(d: str, name: str) -> tuple[dict, np.ndarray]:
    with open(os.path.join(d, name + ".json")) as f:
        meta = json.load(f)
    with open(os.path.join(d, name + ".z"), "rb") as f:
        return meta, np.frombuffer(zlib.decompress(f.read()), meta["dtype"])


def band(d: str, name: str) -> np.ndarray:
    """The GPU's f32 bits over one dumped band, checked against the dump's CRC-32."""
    meta, diff = _raw(d, name)
    diff = diff.astype(np.int64)
    if meta["diff"]:
        diff = np.cumsum(diff)
    n, base = meta["n"], meta["base"]
    x = (np.arange(n, dtype=np.uint64) + base).astype(np.uint32).view(np.float32)
    fn = {
        "ex2": np.exp2,
        "lg2": np.log2,
        "rcp": lambda v: 1.0 / v,
        "rsqrt": lambda v: 1.0 / np.sqrt(v),
    }[meta["op"].split(".")[0]]
    ref = fn(x.astype(np.float64)).astype(np.float32).view(np.uint32)
    hw = mufu.unordered(mufu.ordered(ref) + diff)
    assert zlib.crc32(hw.tobytes()) == meta["crc"], name
    return hw


def _exponent(bits: np.ndarray, delta: int) -> np.ndarray:
    return (bits.astype(np.int64) + (delta << 23)).astype(np.uint32)


def tables(d: str) -> dict:
    """name -> the table's f32 bits, from the dumps in directory ``d``."""
    out = {}
    if os.path.exists(os.path.join(d, "rcp_1_2.json")):
        out["rcp"] = band(d, "rcp_1_2")  # 1/m in (0.5, 1]
        out["rsqrt"] = band(d, "rsqrt_1_4")
        out["ex2_pos"] = _exponent(band(d, "ex2_1"), -1)  # 2^(1+f) / 2
        out["ex2_neg"] = _exponent(band(d, "ex2_m1"), 1)  # 2^-(1+f) * 2
        out["lg2_pos"] = band(d, "lg2_1")
        out["lg2_neg"] = band(d, "lg2_0p5") ^ np.uint32(0x80000000)  # -(-1 + L(m))
    if os.path.exists(os.path.join(d, "sc_sin_0.json")):
        # sin and cos of one x per 2^-25 turn in [0, 1/2): the first quadrant is all reachable
        n = 1 << 23
        sin = np.concatenate([_raw(d, f"sc_sin_{i}")[1] for i in range(4)])
        cos = np.concatenate([_raw(d, f"sc_cos_{i}")[1] for i in range(4)])
        found = _raw(d, "sc_found")[1].astype(bool)
        assert found[:n].all()
        both = found[n:]  # the second quadrant: sin is the first's cos, cos minus its sin
        assert (sin[n:][both] == cos[:n][both]).all()
        assert (cos[n:][both] == sin[:n][both] ^ np.uint32(0x80000000)).all()
        out["sincos"] = np.concatenate([sin[:n], cos[:n]])
    return out


def main() -> None:
    d = sys.argv[1]
    wanted = set(sys.argv[2:])
    for name, hw in tables(d).items():
        if wanted and name not in wanted:
            continue
        arrays = mufu.encode(name, hw)
        path = os.path.join(mufu.DATA, f"mufu_{name}.npz")
        np.savez(path, **arrays)
        assert (mufu.decode(name, np.load(path)) == hw).all()
        print(f"{name:8} {os.path.getsize(path):>8} bytes, {len(arrays['wide'])} wide")


if __name__ == "__main__":
    main()
