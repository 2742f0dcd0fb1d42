"""bench/sass_loop.py: finding the matmul's main loop in SASS, and (where ptxas and cuobjdump
are installed) a guard on its size: loop-invariant address arithmetic must stay outside."""

from __future__ import annotations

import os
import shutil

import pytest

from bench.sass_loop import default_bin, main_loop, measure, parse_sass, tool
from kaio.types import f16
from kaio_ops._matmul_kernels import matmul_kernel
from kaio_ops.matmul import CONFIGS

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x000 */
        /*0010*/                   IMAD R2, R3, 0x4, R4 ;                 /* 0x000 */
        /*0020*/                   IADD3 R5, R5, 0x1, RZ ;                /* 0x000 */
        /*0030*/              @P0 BRA 0x20 ;                              /* 0x000 */
        /*0040*/                   LDSM.16.M88.4 R8, [R2] ;               /* 0x000 */
        /*0050*/                   HMMA.16816.F32 R12, R8, R10, R12 ;     /* 0x000 */
        /*0060*/                   ISETP.NE.AND P0, PT, R5, RZ, PT ;      /* 0x000 */
        /*0070*/              @P0 BRA 0x40 ;                              /* 0x000 */
        /*0080*/                   EXIT ;                                 /* 0x000 */
        /*0090*/                   BRA 0x90 ;                             /* 0x000 */
"""


def test_the_main_loop_is_the_innermost_backward_branch_around_an_hmma():
    sass = parse_sass(SASS)
    assert len(sass) == 10
    assert main_loop(sass) == [
        "LDSM.16.M88.4 R8, [R2]",
        "HMMA.16816.F32 R12, R8, R10, R12",
        "ISETP.NE.AND P0, PT, R5, RZ, PT",
        "@P0 BRA 0x40",
    ]
    assert main_loop(sass[:4]) == []  # a loop without HMMA is not it


def _tools() -> str:
    bin_dir = default_bin()
    found = all(shutil.which(tool(bin_dir, t)) for t in ("ptxas", "cuobjdump"))
    if not found:
        pytest.skip("needs ptxas and cuobjdump (the nvidia-cuda-nvcc wheel)")
    return bin_dir


# Pipelined f16 kernel, sm_90: SASS instructions per k tile (64 HMMA, 16 LDSM, the cp.async
# copies), measured 172 and 154 with ptxas 12.8 and 13.5; without the hoisting 207 and 187.
LOOP_BOUND = {"128x128": 180, "128x256": 162}


@pytest.mark.parametrize("name", sorted(LOOP_BOUND))
def test_the_matmul_main_loop_stays_tight(name):
    bin_dir = _tools()
    constexprs = CONFIGS[name].constexprs(True, True)
    stats = measure(matmul_kernel.ptx(arch="sm_90", DT=f16, **constexprs), "sm_90", bin_dir)
    assert stats.hmma == 64
    assert stats.instructions <= LOOP_BOUND[name], stats
    assert stats.spills == 0, stats


def test_the_tools_folder_can_be_chosen(monkeypatch):
    monkeypatch.setenv("KAIO_CUDA_BIN", "/opt/cuda/bin")
    assert default_bin() == "/opt/cuda/bin"
    assert tool("", "ptxas") == "ptxas"
    assert tool("/opt/cuda/bin", "ptxas") == os.path.join("/opt/cuda/bin", "ptxas")
