"""Rounds only (bwd64): write variants of the branch's ordered-kernel module to /tmp for the
ab's "module" override: wide (dQ converted by dq_convert_wide), pdl (wide, and the kernel
launched while prep finishes: programmatic dependent launch), rev (wide, the last tiles
first), behind (dq_convert_behind after the kernel, PDL)."""

SRC = "kaio_ops/_attention_hopper_bwd_fused.py"
WIDE = (
    "        dq_convert_tiles[-(-qa.size // 1024), 256, stream, 0](",
    "        dq_convert_wide[-(-qa.size // 4096), 256, stream, 0](",
)
PDL = [
    (
        "    kaio.sync_threads()\n    x, kvh, first_head, first, n_tiles, start = work_item(blk",
        "    kaio.sync_threads()\n    kaio.grid_dependency_wait()\n"
        "    x, kvh, first_head, first, n_tiles, start = work_item(blk",
    ),
    ("    L = D // 8  # (lanes a row)\n", "    kaio.launch_dependents()\n    L = D // 8\n"),
]


def write(name, edits):
    s = open(SRC).read()
    for old, new in edits:
        assert s.count(old) == 1, old
        s = s.replace(old, new)
    open(f"/tmp/fused_{name}.py", "w").write(s)


REV = (  # the tiles converted last-written first (those likely still in L2)
    "    u = i32(kaio.block_idx_x()) * 256 + i32(kaio.thread_idx_x())\n    nt =",
    "    u = (i32(kaio.grid_dim_x()) - 1 - i32(kaio.block_idx_x())) * 256 + i32(kaio.thread_idx_x())\n"
    "    nt =",
)


BEHIND = [  # dQ converted behind the kernel (its blocks on the multiprocessors it leaves)
    (
        "    kaio.sync_threads()\n    x, kvh, first_head, first, n_tiles, start = work_item(blk",
        "    kaio.sync_threads()\n    kaio.launch_dependents()\n"
        "    x, kvh, first_head, first, n_tiles, start = work_item(blk",
    ),
    (
        "        dq_convert_tiles[-(-qa.size // 1024), 256, stream, 0](\n"
        "            dq_out, dq_acc, bh * sq, sq, scale, D=d, DT=qa.dtype\n        )",
        "        dq_convert_behind[-(-qa.size // 4096), 256, stream, 0](\n"
        "            dq_out, dq_acc, sem, bh * sq, sq, nkb, int(causal), scale, D=d, BK=bk,"
        " DT=qa.dtype\n        )",
    ),
]


HINT = [  # L2 fetches 256 bytes on a miss (ld.L2::256B): prep's and the conversion's loads
    ("kaio.load_vector(a[s], o, row * D + c)", "kaio.load_vector(a[s], o, row * D + c, 256)"),
    ("kaio.load_vector(b[s], do, row * D + c)", "kaio.load_vector(b[s], do, row * D + c, 256)"),
    ('kaio.load_vector(x[k], acc, at + 4 * k, 0, "cg")',
     'kaio.load_vector(x[k], acc, at + 4 * k, 256, "cg")'),
]
PDL_BEHIND = [  # PDL from prep to the kernel and from the kernel to dq_convert_behind
    (
        "    kaio.sync_threads()\n    x, kvh, first_head, first, n_tiles, start = work_item(blk",
        "    kaio.sync_threads()\n    kaio.grid_dependency_wait()\n    kaio.launch_dependents()\n"
        "    x, kvh, first_head, first, n_tiles, start = work_item(blk",
    ),
    PDL[1],
    BEHIND[1],
]


PAIRS = ("PERSIST = {64: (1, 0), 128: (0, 0)}", "PERSIST = {64: (1, 1), 128: (0, 0)}")


write("wide", [WIDE])
write("pairs", [PAIRS])
write("hint", HINT)
write("pdlbehind", PDL_BEHIND)
write("behind", BEHIND)
write("rev", [WIDE, REV])
write("pdl", [WIDE, *PDL])
