"""What the performance page checks a run against: the hand-maintained part of
``python -m bench report``.

- ``TARGETS``: the speed each op family must reach (from the issues that asked for the op).
  The report lists every case of a run that misses one under "Known gaps", and every target
  that matched no data under "Not measured in this run" (a renamed op or case shows up there).
- ``NOTES``: why a known gap is there, attached to the gaps whose op and case match.
- ``OPEN_GAPS``: gaps the data of a run cannot show.
- ``FAMILIES``: which ops share a plot; ``PEAK_KEYS``: which ``mma.sync`` peak is the ceiling of
  an op that counts FLOPs.

Patterns are regular expressions searched (``re.search``) in the names the benchmarks record.
"""

from __future__ import annotations

from dataclasses import dataclass

NOISE = 0.03  # "not slower beyond noise": a time ratio of at least 1 - NOISE


@dataclass(frozen=True)
class Target:
    """A target for the cases of the ops matching ``op`` (and ``case``) in the suites matching
    ``suite``: the best correct kaio implementation (impls matching ``kaio``) must reach
    ``min_ratio`` times the speed of the fastest correct impl matching ``peer`` (peer time /
    kaio time), and/or ``min_share`` of the page's ceiling for the case."""

    what: str  # the target in words, as the page prints it
    op: str
    case: str = ""
    suite: str = ""
    peer: str = ""
    min_ratio: float | None = None
    min_share: float | None = None
    kaio: str = r"(?i)kaio"
    source: str = ""  # where the target comes from (an issue)


_SQUARE_BIG = r"^(4096x4096x4096|8192x8192x8192)$"
_DECODE = r"^(1|16)x4096x4096$"
_MEMORY_OPS = r"^(silu_gate|gelu|add|mul|rms_norm|layer_norm|softmax|rope)"

_MATMUL = {"suite": "matmul", "op": r"^matmul b?f16$", "source": "issue 6"}
_HOPPER = {**_MATMUL, "source": "issue 12"}
_HOPPER_F16 = {**_HOPPER, "op": r"^matmul f16, f16 C$"}
_MEMORY = {"suite": "memory", "op": _MEMORY_OPS, "source": "issue 9"}
_QUANT = {"suite": "quant|gguf", "source": "issue 7"}
_ATTENTION = {"suite": "attention", "source": "issue 8"}
_SWEEP = {"suite": "gemm-sweep", "source": "issue 33"}
_SDPA_FLASH = "(?i)sdpa.*flash|flash.*sdpa"
# kernel time (a graph of many calls); the ops ending ", one call a graph" are not checked
_DECODE_ATTN = {
    "suite": "decode",
    "op": r"^flash_attention_decode f16( paged)?$",
    "source": "issue 34",
}
# the decode-attention cases that read at least 64 MB of K/V (ragged: 5/8 of that on average)
_DECODE_64MB = r"^(B1 L32768 |B16 L1024 H|B16 L(4096|32768) |B64 )"

TARGETS: tuple[Target, ...] = (
    Target("decode attention: at least 80% of the copy bandwidth where a call reads >= 64 MB of "
           "K/V", case=_DECODE_64MB, min_share=0.8, **_DECODE_ATTN),
    Target("decode attention at B = 1, L = 4096: at least 2x torch SDPA", case=r"^B1 L4096 ",
           peer=r"^torch SDPA$", min_ratio=2.0, **_DECODE_ATTN),
    Target("decode attention: never slower than torch SDPA (any backend)", peer=r"^torch SDPA",
           min_ratio=1.0 - NOISE, **_DECODE_ATTN),
    Target("f16/bf16 matmul at 4096^3 and 8192^3: at least 60% of cuBLAS", case=_SQUARE_BIG,
           peer="^cuBLAS$", min_ratio=0.6, **_MATMUL),
    Target("f16/bf16 matmul at 4096^3 and 8192^3 on Hopper (wgmma): at least 95% of cuBLAS "
           "with the same f32 output", case=_SQUARE_BIG, peer="^cuBLAS f32 out$",
           min_ratio=0.95, **_HOPPER),
    Target("f16/bf16 matmul at 4096^3 and 8192^3 on Hopper (wgmma): faster than Triton with "
           "the same f32 output", case=_SQUARE_BIG, peer="^Triton f32 out$", min_ratio=1.0,
           **_HOPPER),
    Target("the Hopper kernel writing f16 at 4096^3 and 8192^3: at least 95% of cuBLAS (f16 "
           "output)", case=_SQUARE_BIG, peer="^cuBLAS$", min_ratio=0.95, **_HOPPER_F16),
    Target("the Hopper kernel writing f16 at 4096^3 and 8192^3: faster than Triton (f16 "
           "output)", case=_SQUARE_BIG, peer="^Triton$", min_ratio=1.0, **_HOPPER_F16),
    Target("f16/bf16 matmul at 1024^3: at least 50% of cuBLAS", case="^1024x1024x1024$",
           peer="^cuBLAS$", min_ratio=0.5, **_MATMUL),
    Target("f16/bf16 matmul at decode shapes: within 1.5x of cuBLAS's time", case=_DECODE,
           peer="^cuBLAS$", min_ratio=1 / 1.5, **_MATMUL),
    Target("f16/bf16 matmul: async not slower than sync beyond noise", kaio="^kaio async$",
           peer="^kaio sync$", min_ratio=1 - NOISE, **_MATMUL),
    Target("memory-bound ops: at least 85% of the copy bandwidth", min_share=0.85, **_MEMORY),
    Target("memory-bound ops: not slower than Triton beyond noise", peer="(?i)^triton$",
           min_ratio=1 - NOISE, **_MEMORY),
    Target("int8 matmul at 4096^3: at least 3x torch._int_mm", op="int8", case="4096x4096x4096",
           peer="_int_mm", min_ratio=3.0, **_QUANT),
    Target("int4 matmul at decode shapes: at least 2.5x faster than cuBLAS f16", op="int4",
           case=_DECODE, peer="cuBLAS", min_ratio=2.5, **_QUANT),
    Target("int4 matmul at M = 4096: at least 50% of cuBLAS f16", op="int4", case="^4096x",
           peer="cuBLAS", min_ratio=0.5, **_QUANT),
    Target("fused QKV projection: not slower than three calls", op="(?i)qkv",
           peer="(?i)three|3 calls|sep", min_ratio=1 - NOISE, **_QUANT),
    Target("quantize_q6_k of 4096 x 4096: at least 25% of the copy bandwidth",
           op="^quantize_q6_k$", min_share=0.25, **_QUANT),
    Target("quantize_q6_k of 4096 x 4096: at least 100x the NumPy reference on the host",
           op="^quantize_q6_k$", peer="(?i)numpy", min_ratio=100, **_QUANT),
    Target("flash_attention f16 forward, B4 H16 S4096 D128: at least 70% of SDPA's flash "
           "backend", op="^flash_attention f16( causal)?$", case="^B4 H16(/16)? S4096 D128$",
           peer=_SDPA_FLASH, min_ratio=0.7, **_ATTENTION),
    Target("flash_attention f16 backward, B4 H16 S4096 D128: at least 50% of SDPA's flash "
           "backend", op="^flash_attention_bwd f16", case="^B4 H16(/16)? S4096 D128$",
           peer=_SDPA_FLASH, min_ratio=0.5, **_ATTENTION),
    Target("LLM GEMM sweep (kaio_ops.matmul, f16/bf16 out): no case below 0.9x cuBLAS",
           op=r"^gemm sweep b?f16$", peer="^cuBLAS$", min_ratio=0.9, **_SWEEP),
    Target("square GEMM 1024^3 and 2048^3 (kaio_ops.matmul): at least 0.95x cuBLAS",
           op=r"^gemm square b?f16$", peer="^cuBLAS$", min_ratio=0.95, **_SWEEP),
    Target("fused linear epilogues: faster than the separate torch ops",
           op=r"^linear .* \+ bias \+ residual$", peer="^torch$", min_ratio=1.0, **_SWEEP),
    Target("attention_flash f32, S4096 D128: at least as fast as SDPA's memory-efficient "
           "backend", op="^attention_flash f32( causal)?$", case="S4096 D128",
           peer="(?i)sdpa.*(efficient|mem)", min_ratio=1 - NOISE, **_ATTENTION),
)  # fmt: skip

# Launch overhead (bench/launch_overhead.py, issue 3): kaio's host time per launch
LAUNCH_MAX_US = 5.0
LAUNCH_KAIO = r"^kaio "  # the rows that are kaio launches: each below the peer's time
# the rows held to LAUNCH_MAX_US: kaio's launches of its own arrays. A torch tensor costs
# more (five of torch's accessors per tensor) and is only held below Triton, which takes the
# same tensors.
LAUNCH_KAIO_OWN = r"^kaio .*DeviceArray$"
LAUNCH_PEER = r"^triton "  # must also be slower than kaio

# Compile time (bench/compile_time.py): figure -> (limit, unit). Read on the fastest fresh
# process's CPU time, which a busy host touches least (bench/compile_time.py says why); runs
# before it was recorded (2026-11-28) are read on the median wall time (the key without
# "_cpu_min").
COMPILE_MAX = {
    "first_compile_cpu_min_ms": (50.0, "ms"),
    "cached_ptx_call_cpu_min_us": (50.0, "µs"),
}


@dataclass(frozen=True)
class Note:
    """Why the gaps of the ops matching ``op`` (and cases matching ``case``) are there."""

    op: str
    text: str
    case: str = ""


NOTES: tuple[Note, ...] = (
    Note(
        r"^softmax$",
        "The row is held in registers and each element needs one exp; what is "
        "left is the time between a block's loads and its stores (max, exp, block reduction, "
        "scale), which more rows in flight per SM would hide: a row kernel that prefetches "
        "the next row (a persistent kernel) is the next step.",
        r"b?f16",
    ),
    Note(
        r"^gelu none$", "Compute-bound at 16-bit sizes: 8 elements a thread, an erf each.", r"b?f16"
    ),
    Note(
        r"^gelu tanh$",
        "The instruction count per element: Triton's `div.full` and "
        "`ex2.approx.ftz` are cheaper than kaio's `rsqrt(d*d)` reciprocal and non-ftz "
        "`ex2.approx`.",
        r"b?f16",
    ),
    Note(
        r"^softmax long rows$",
        "A row of 262144 f32 (1 MB) no longer fits one block; on sm_90 it goes to a cluster "
        "of 16 blocks that each keep 64 KB of it in shared memory and exchange their max and "
        "sum through distributed shared memory (kaio_ops/_long_rows.py), so the row is read "
        "once: 65% -> 86% of copy on an H100 (2026-11-25; the single-block path read it "
        "twice, 2.94 transfers: at most 68%). On an H200 the same kernel gave 68-72%: each "
        "block loaded its slice, waited at a cluster barrier, then wrote it, and while it "
        "waited its multiprocessor's loads stopped. Since 2026-11-26 f32 takes a persistent "
        "grid of as many clusters as fit (21, from cuOccupancyMaxActiveClusters), each block "
        "copying the next row's slice by cp.async while it writes the current one and "
        "computing one exponential a value: 72% -> 78% on an H200 (four calls between a "
        "pair of events), equal on an H100 (85%). Other shapes compared are listed in the "
        "module (threads, cluster sizes, registers, bulk stores); without any cluster "
        "exchange at all (a wrong result, to see its cost) it reached 80-82%: the cluster "
        "barrier costs a few percent, and the rest is not yet explained.",
    ),
    Note(
        r"^quantize_q6_k$",
        "Q6_K is bound by instruction issue, not memory: its time is the same whatever the "
        "input's dtype. The work is the reference's scale search: each 16-value sub-block tries "
        "19 candidate scales, and each try is a pass over the 16 values whose sums must be "
        "rounded in the C code's order, so they cannot be reassociated, fused or vectorized. "
        "The kernel's pass is 9 SASS instructions a value: 2736 per sub-block for the search "
        "alone, 2.87 G thread-instructions for the tensor, 86 µs at one warp-instruction per "
        "clock on each of the 528 schedulers (1.98 GHz); at that floor the f32 case would move "
        "81 MB in 86 µs, 22% of copy. So 25% is out of reach for any bit-exact encoder that "
        "evaluates every candidate this way (with the 19 IEEE divisions per sub-block, the "
        "scale quantization and the re-quantization, about 4200 instructions per lane; measured "
        "on an H200, 2026-11-22, the kernel issued at about 80% of the peak rate). Skipping "
        "passes, counted on the host (NumPy, 65536 sub-blocks of N(0, 0.02) values, "
        "2026-11-26): a candidate whose 16 quants equal those of the candidate before it "
        "provably leaves the search's state unchanged; a sub-block needs 9.8 of its 19 "
        "passes on average, but a warp runs as many as its slowest lane, 13.5 (71%), before "
        "the cost of finding the repeats (each value's rounding steps between the candidate "
        "scales); handing the needed passes out across lanes makes each pass load or rebuild "
        "its sub-block's values, 4 more instructions a value, which gives back about what it "
        "saves (52% of the passes at 13 instructions a value: 75%). Scoring the candidates "
        "cheaply and running the exact pass only on close calls fails too: in 21% of the "
        "sub-blocks the two best distinct quant vectors score within 1e-6 of each other "
        "(59% within 1e-5), closer than a cheaper evaluation's error.",
    ),
    Note(
        r"^rms_norm_residual$",
        "In one run (H100, 2026-11-25) the f16 case's kaio calls were disturbed: their "
        "fastest took 0.365 ms (Triton's median 0.359) but some took up to 0.78 ms and lifted "
        "the median to 0.398; the bf16 case, the same bytes and the same kernel, measured "
        "0.367 ms, 0.98x Triton. The runs before and after it, with the same code, gave 0.97x "
        "to 1.00x on all three cases.",
        r"^f16 \[32768",
    ),
    Note(
        r"^matmul_int4$",
        "Timed one call at a time, 2.5x is out of reach on an H100 for any kernel that reads "
        "the int4 weights from DRAM: the floor row, a kernel that only reads them (16-byte "
        "loads, all in flight at once), measures 2.45x cuBLAS at M = 1 in this page's run "
        "(H100, 2026-11-26; 2.24x, 7.4 µs against 16.7, in the run before, L2 cold). With 20 "
        "calls in a row, as in a CUDA graph, the floor is 2.7x and kaio 1.9x to 2.0x. On an H200 "
        "(2026-11-26, the same code) kaio measured 1.81x and 1.67x at M = 1 and 16, one call "
        "at a time. (Earlier pages gave 1.91x and 1.95x one call at a time: 3 "
        "rotating input sets then left the 8.4 MB of int4 words warm in the 50 MB L2; the sets "
        "are now counted on the int4 words, 16 sets, and the figure is 1.8x.) The kernel itself "
        "is bound by instruction latency, not bandwidth: under Nsight Compute it issues 0.4 "
        "instructions a cycle per scheduler with 2 warps each (one 256-thread block a "
        "multiprocessor, 128 blocks), stalls per instruction 1.1 on fixed-latency dependencies, "
        "0.8 on memory, 0.4 on the math pipes. Kernel time alone, from CUPTI (torch.profiler, "
        "120 calls; H100, 2026-11-25, a separate run): cuBLAS 13.6 µs, the floor 4.4, kaio "
        "6.4 at M = 1 (2.1x cuBLAS) and 7.1 at M = 16 (cuBLAS 15.5 in two kernels, 2.2x): "
        "without any gap between events the kernel is still 2 µs over the floor. Why more "
        "loads in flight do not help: ptxas puts every global load of the kernel on one "
        "scoreboard (sb5, decoded from the SASS control bits), so the first use of a group's "
        "words waits for every load then in flight. In the shipped kernel that use comes "
        "before the "
        "next group's loads are issued, so they fly while the group is multiplied. Measured "
        "and not better (kernel time, M = 1, against 6.4): four register buffers, a warp's "
        "4 groups requested at once (8.1: it waits for all 4, then multiplies with nothing in "
        "flight); one group at a time with 8, 16 or 32 warps a block (7.8, 7.1, 6.6); one lop3 "
        "per nibble pair and one fma for the odd pairs, 20% fewer instructions (7.3: its "
        "shorter code lets ptxas issue the next group's loads before the first use); the "
        "weights, x and scales staged by cp.async in a ring per warp, whose waits are exact "
        "(12 to 13.5 at M = 1, where 8 lanes copy the same x bytes; 9.4 to 10.8 against 7.1 "
        "at M = 16; not looked into further); two ways of waiting, alternate groups by "
        "ld.global into registers and by cp.async into a stage per warp, x copied once a "
        "warp (6.8; 6.45 with the lop3 decode, equal; 7.9 to 8.0 at M = 16). Earlier "
        "sessions, timed by "
        "events: an L2 prefetch of the block's rows (9.2 µs in a row against 7.7 to 8.0); "
        "the weights staged by TMA in a ring per warp (8.7 to 8.9 in a row, 8.3 with lop3, "
        "2% faster at M = 16); the two register buffers' multiplies without the branches "
        "between them (10.5 one at a time against 9.3). Removing the mma.sync entirely saves "
        "0.4 µs, removing the dequantization 0.2: neither alone is the limit.",
        r"^(1|16)x",
    ),
    Note(
        r"^matmul b?f16(, f16 C)?$",
        "At 8192³ the kaio Hopper kernel's calls spread by about 10% between fastest and "
        "slowest, more than Triton's, so its medians differ run to run while its fastest "
        "calls match or beat the peers'. The cause, measured later the same day (H100, "
        "nvidia-smi sampling every 20 ms beside 40 calls of each, one process): within about "
        "0.1 s of back-to-back 8192³ matmuls the GPU reaches its software power cap (clock "
        "event reason 0x4) and the SM clock falls from 1980 MHz to as low as 1395; kaio "
        "went from a 1.485 ms median at 1980 MHz to 1.686 once capped, cuBLAS f16 from 1.453 "
        "to 1.669, so whichever implementation runs while the cap holds is slowed alike; the "
        "harness now times each case in rounds that take the implementations in turn. In "
        "the run of this page (H100, 2026-11-26, rounds), f16: kaio async median 1.601 ms, "
        "fastest 1.493, kaio sync 1.625 and 1.499, against Triton f32 out's 1.642 and 1.571 "
        "and cuBLAS f32 out's 1.646 and 1.483; f16 out: kaio 1.680 and 1.588 against "
        "Triton's 1.612 and 1.564 and cuBLAS's 1.668 and 1.446; bf16: kaio async 1.511 and "
        "1.441, kaio sync 1.464 and 1.441 (the same fastest call), against Triton f32 out's "
        "1.485 and 1.469 and cuBLAS f32 out's 1.479 and 1.426. The run before (H100, "
        "2026-11-25, rounds) gave kaio async 0.98x Triton f32 out at f16 and kaio f16 out "
        "1.590 ms against cuBLAS's 1.611; the three before it, with the same kernel and no "
        "rounds, 0.94x, 0.94x and 1.00x. In one process, three "
        "rounds through the public ops (H100, 2026-11-25): "
        "8192³ f16 1.03x Triton f32 out and 1.00x cuBLAS f32 out, bf16 1.03x and 1.00x; "
        "4096³ f16 1.04x and 0.97x, bf16 1.05x and 0.97x.",
        r"^8192x",
    ),
    Note(
        r"^kaio ",
        "The driver call alone, with nothing left to prepare, is the raw ctypes "
        "rows' figure; kaio's own cost is the difference to it (per torch tensor five reads "
        "through torch's API: `dtype`, `get_device()`, `shape`, `is_contiguous()`, "
        "`data_ptr()`, 56 to 127 ns each on an H200 host; CuPy's `flags` costs 211 ns). The "
        "floor differs from host to host more than kaio's share does: in two runs on H200 "
        "machines on 2026-11-22 with the same launch code, the raw call took 3.54 µs on one "
        "(kaio's pre-bound DeviceArray launch 4.24 µs, subscripted 4.34, Triton 11.60) and "
        "4.95 µs on another (kaio 6.48 and 6.81, Triton 18.64).",
    ),
)

OPEN_GAPS: tuple[str, ...] = (
    "**Decode with PDL on the H100, one call a graph** (issue 34): the H100 keeps PDL 1 in "
    "one-split paged grids of up to 4k keys, whose L2 prefetch of each block's first key "
    "tiles before the wait cost an H200 1.8-2.1 µs a call wherever no decode call before it "
    "hides it (a graph of one call, a call behind any other kernel; 2026-11-28: B16 L1024 "
    "paged 24.0 µs against 22.8 for SDPA, 0.95x). The H200 now takes PDL without the "
    "prefetch up to 2k keys and none over them (over SDPA in a graph of many calls, one call "
    "a graph and behind a kernel: B16 L1024 paged 18.5 / 22.4 / 24.0 µs against 20.0 / 22.8 "
    "/ 24.9). Not measured on an H100 this session.",
)

# (suite pattern, op pattern, family): ops of one family share a plot; an op matching none is
# in a family named after its suite's title
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("matmul", r"^(matmul|sgemm)", "matmul"),
    ("memory", r"^(silu_gate|gelu|add|mul)", "elementwise"),
    ("memory", r"^(rms_norm|layer_norm|softmax)", "row ops"),
    ("memory", r"^rope", "rope"),
    ("attention", r"^flash_attention", "flash_attention"),
    ("attention", r"^attention_flash", "attention_flash f32"),
    ("attention", r"^attention_tc", "attention_tc"),
    ("gguf", r"^quantize", "quantizers"),
    ("gguf", r"^dequantize", "dequantizers"),
)

# (suite pattern, peer op pattern, op pattern): the peer op's impls are also peers of the ops
# matching the last pattern, on the cases both have (cuBLAS sgemm, KAIO's published baseline,
# beside the f16 and bf16 matmuls); a peer op with no kaio impl then has no table of its own
SHARED_PEERS: tuple[tuple[str, str, str], ...] = (("matmul", r"^sgemm", r"^matmul b?f16$"),)

# (pattern on "op case", key of the mma.sync peaks a suite records): the first match wins;
# names are split at anything but letters and digits ("matmul_int8" holds "int8")
PEAK_KEYS: tuple[tuple[str, str], ...] = (
    (r"^qkv_project_int8 ", "f16"),  # W8A16: f16 mma.sync after widening the int8 weights
    (r"(?<![a-z0-9])bf16(?![a-z0-9])", "bf16"),
    (r"(?<![a-z0-9])(f16|fp16|half)(?![a-z0-9])", "f16"),
    (r"(?<![a-z0-9])(s8|int8|i8)(?![a-z0-9])", "s8"),
    (r"(?<![a-z0-9])int4(?![a-z0-9])", "f16"),  # W4A16 runs f16 mma.sync after dequantizing
)
