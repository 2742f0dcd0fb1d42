"""Launch rules the GPU and the simulator share (issue 29): the launch subscript, the GPU's
limits checked before anything runs, and the simulator's small promises (read-only arrays,
``race_check``, ``KAIO_DUMP_DIR``, clear errors for missing constexprs and missing sources).
Everything here runs without a GPU: a GPU launch's subscript is parsed before any driver call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kaio
from kaio import f32, u32
from kaio.errors import CompileError, LaunchError, SimulationError


@kaio.gpu_kernel(block_size=(32, 8))
def tile_ids(out: f32[:, :, :]):
    x = kaio.block_idx_x() * 32 + kaio.thread_idx_x()
    y = kaio.block_idx_y() * 8 + kaio.thread_idx_y()
    out[kaio.block_idx_z(), y, x] = f32(kaio.block_idx_x() + 10 * kaio.block_idx_y())


@kaio.gpu_kernel(block_size=64)
def plus_one(x: f32[:], out: f32[:], n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * 64
    if i < n:
        out[i] = x[i] + 1.0


@kaio.gpu_kernel
def dynamic_user(out: f32[:]):
    d = kaio.shared_dynamic(f32)
    d[kaio.thread_idx_x()] = 1.0
    out[kaio.thread_idx_x()] = d[kaio.thread_idx_x()]


@kaio.gpu_kernel(block_size=32, arch="sm_80")
def dynamic_sm80(out: f32[:]):
    d = kaio.shared_dynamic(f32)
    d[kaio.thread_idx_x()] = 2.0
    out[kaio.thread_idx_x()] = d[kaio.thread_idx_x()]


@kaio.gpu_kernel(block_size=32)
def racy(out: f32[:]):
    s = kaio.shared(f32, (32,))
    s[kaio.thread_idx_x()] = 1.0
    out[kaio.thread_idx_x()] = s[31 - kaio.thread_idx_x()]  # no barrier: a race


@kaio.gpu_kernel(block_size=32)
def needs_k(out: f32[:], K: kaio.constexpr):
    out[kaio.thread_idx_x()] = f32(K)


def _expected_tiles(gx: int, gy: int, gz: int) -> np.ndarray:
    bx = np.arange(gx * 32) // 32
    by = np.arange(gy * 8) // 8
    plane = (bx[None, :] + 10 * by[:, None]).astype(np.float64)
    return np.broadcast_to(plane, (gz, gy * 8, gx * 32))


# ------------------------------------------------------------------ the launch subscript
@pytest.mark.parametrize("launch", [lambda k: k.sim, lambda k: k], ids=["sim", "launch"])
def test_two_ints_contradicting_the_declared_block_are_refused(launch):
    # Regression: k[(2, 3)] is Python's k[2, 3]; it ran grid 2 with block 3 although the
    # kernel declares block_size=(32, 8). Now a LaunchError that shows the 2-D grid spelling.
    with pytest.raises(LaunchError) as info:
        launch(tile_ids)[(2, 3)]
    text = str(info.value)
    assert "tile_ids" in text and "block_size=(32, 8)" in text and "kernel[(2, 3),]" in text
    with pytest.raises(LaunchError, match=r"kernel\[\(2, 3, 4\),\]"):
        launch(tile_ids)[(2, 3, 4)]  # read as grid, block, stream: was silently a 3-D grid
    with pytest.raises(LaunchError, match="declares"):
        launch(tile_ids)[2, (32, 4)]
    with pytest.raises(LaunchError, match="declares"):
        launch(plus_one)[4, 128]


def test_grids_of_two_and_three_dimensions_run_in_the_simulator():
    for grid, sub in (((2, 3, 1), ((2, 3),)), ((2, 3, 2), ((2, 3, 2), (32, 8)))):
        out = np.full((grid[2], grid[1] * 8, grid[0] * 32), np.nan, np.float32)
        tile_ids.sim[sub](out)
        np.testing.assert_array_equal(out, _expected_tiles(*grid))
    # the declared block given again explicitly agrees, so it is accepted (GPU: parsed only)
    assert tile_ids[(2, 3), (32, 8)].config.block == (32, 8, 1)
    assert plus_one[4, 64].config.block == (64, 1, 1)
    x = np.random.default_rng(1).standard_normal(100).astype(np.float32)
    out = np.full(100, np.nan, np.float32)
    plus_one.sim[2, 64](x, out, 100)
    np.testing.assert_array_equal(out, x + np.float32(1.0))


def test_a_small_int_stream_is_not_taken_for_a_stream_handle():
    with pytest.raises(LaunchError, match="not a stream handle"):
        plus_one.sim[2, 64, 5]
    assert plus_one[2, 64, 0].config.stream == 0


# ------------------------------------------------------------------ the GPU's limits
@pytest.mark.parametrize(
    "sub, message",
    [
        ((1, (1, 1, 128)), "128 threads in z; a block has at most 64"),
        ((1, (2048,)), "2048 threads in x"),
        ((1, (64, 32)), "2048 threads; a block has at most 1024"),
        (((1, 70000), 32), "70000 blocks in y; a grid has at most 65535"),
        (((1, 1, 65536), 32), "65536 blocks in z"),
        ((2**31, 32), "2147483648 blocks in x"),
    ],
)
@pytest.mark.parametrize("launch", [lambda k: k.sim, lambda k: k], ids=["sim", "launch"])
def test_block_and_grid_limits_are_checked_before_running(launch, sub, message):
    # Regression: the simulator ran block z = 128, grid y = 70000 and 2^31 blocks.
    with pytest.raises(LaunchError, match=message):
        launch(dynamic_user)[sub]


def test_dynamic_shared_memory_over_the_arch_opt_in_limit_is_refused_in_the_simulator():
    out = np.zeros(32, np.float32)
    with pytest.raises(LaunchError, match="1048576 bytes of dynamic shared memory.*232448"):
        dynamic_user.sim[1, 32, None, 1 << 20](out)
    dynamic_user.sim[1, 32, None, 227 * 1024](out)  # sm_90's limit itself is fine
    np.testing.assert_array_equal(out, 1.0)
    with pytest.raises(LaunchError, match="166913 bytes.*166912 bytes a block may use on sm_80"):
        dynamic_sm80.sim[1, 32, None, 163 * 1024 + 1](out)
    dynamic_sm80.sim[1, 32, None, 163 * 1024](out)
    np.testing.assert_array_equal(out, 2.0)


def test_static_shared_over_48_kb_is_a_compile_error_at_the_shared_call():
    @kaio.gpu_kernel(block_size=32)
    def big(out: f32[:]):
        a = kaio.shared(f32, (8192,))  # 32 KB: fine alone
        b = kaio.shared(f32, (12288,))  # 48 KB more: 80 KB in all
        a[kaio.thread_idx_x()] = 1.0
        b[kaio.thread_idx_x()] = 2.0
        out[kaio.thread_idx_x()] = a[0] + b[0]

    for compile_it in (big.ptx, lambda: big.sim[1](np.zeros(32, np.float32))):
        with pytest.raises(CompileError) as info:
            compile_it()
        err = info.value
        assert err.lineno == big.pyfunc.__code__.co_firstlineno + 3  # the second kaio.shared
        assert "49152 bytes" in str(err) and "81920 in all" in str(err)


# ------------------------------------------------------------------ simulator promises
def test_read_only_array_written_by_the_kernel_is_a_launch_error_naming_it():
    x = np.arange(64, dtype=np.float32)
    x.flags.writeable = False
    out = np.full(64, np.nan, np.float32)
    plus_one.sim[1](x, out, 64)  # a read-only input is fine
    np.testing.assert_array_equal(out, np.arange(64) + 1.0)
    out.flags.writeable = False
    with pytest.raises(LaunchError, match="plus_one: argument 'out' is a read-only NumPy array"):
        plus_one.sim[1](x, out, 64)


def test_race_check_can_be_turned_off_for_kernel_sim():
    out = np.zeros(32, np.float32)
    with pytest.raises(SimulationError, match="race"):
        racy.sim[1](out)
    racy.sim(race_check=False)[1](out)
    np.testing.assert_array_equal(out, 1.0)
    with pytest.raises(TypeError):
        racy.sim(False)  # keyword only, so it cannot be mistaken for a kernel argument


def test_dump_dir_gets_the_ir_and_ptx_of_simulated_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("KAIO_DUMP_DIR", str(tmp_path))
    needs_k.sim[1](np.zeros(32, np.float32), K=7)
    names = sorted(os.listdir(tmp_path))
    assert [n.rsplit(".", 1)[-1] for n in names] == ["ir", "ptx"], names
    assert all(n.startswith("needs_k.") and ".sm_90." in n for n in names)
    assert ".entry needs_k" in (tmp_path / names[1]).read_text()
    assert "needs_k" in (tmp_path / names[0]).read_text()


def test_missing_constexpr_is_one_clear_error(capsys, tmp_path):
    with pytest.raises(LaunchError, match="constexpr parameter.*K need a value") as info:
        needs_k.ptx()
    assert info.value.__context__ is None  # no chained KeyError in the traceback
    from kaio.cli import main

    assert main(["ptx", f"{__file__}::needs_k"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-D K=VALUE" in err and "Traceback" not in err
    assert main(["ptx", f"{__file__}::needs_k", "-D", "K=1", "-D", "J=2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "J is not a constexpr" in err


def test_kernel_from_python_c_says_it_needs_a_file():
    code = textwrap.dedent(
        """
        import kaio
        from kaio import f32
        @kaio.gpu_kernel(block_size=32)
        def k(out: f32[:]):
            out[0] = 1.0
        try:
            k.ptx()
        except kaio.CompileError as e:
            print(e)
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert "must be defined in a .py file" in done.stdout and "python -c" in done.stdout


def test_import_kaio_loads_no_driver_bindings_simulator_engine_or_emitter():
    # Regression: `import kaio` imported cuda-bindings, the simulator and the PTX emitter
    # (430-500 ms on CI); now they load on first use, and every public name still resolves.
    code = textwrap.dedent(
        """
        import sys
        import kaio
        heavy = ("cuda.bindings.driver", "kaio.sim.engine", "kaio.ptx.emitter",
                 "kaio.runtime.module", "kaio.runtime.launch")
        print("loaded:", [m for m in heavy if m in sys.modules])
        import kaio.types
        print("types:", [m for m in ("kaio.sim.engine",) if m in sys.modules])
        from kaio import CudaError, Device, DeviceArray, Stream, to_device, zeros, simulate
        from kaio.runtime import Resources, info
        from kaio.sim import SimLauncher, simulate_ir, active
        star = {}
        exec("from kaio import *", star)
        print("star:", all(n in star for n in ("Device", "to_device", "f32", "thread_idx_x")))
        print("dir:", "DeviceArray" in dir(kaio) and "Resources" in dir(kaio.runtime))
        import kaio.runtime.device  # the submodule shadows kaio.runtime's lazy `device`
        print("device:", kaio.device is kaio.runtime.device.device)
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["loaded: []", "types: []", "star: True", "dir: True", "device: True"], (
        done.stdout
    )


@pytest.mark.gpu
def test_gpu_grids_of_two_and_three_dimensions_and_the_devices_shared_limit():
    for grid, sub in (((2, 3, 1), ((2, 3),)), ((2, 3, 2), ((2, 3, 2), (32, 8)))):
        out = kaio.to_device(np.full((grid[2], grid[1] * 8, grid[0] * 32), np.nan, np.float32))
        tile_ids[sub](out)
        np.testing.assert_array_equal(out.numpy(), _expected_tiles(*grid))
    with pytest.raises(LaunchError, match="kernel\\[\\(2, 3\\),\\]"):
        tile_ids[(2, 3)](out)
    limit = kaio.device().max_shared_per_block_optin
    out = kaio.zeros(32, f32)
    dynamic_user[1, 32, None, limit](out)  # the device's own opt-in limit, exactly
    np.testing.assert_array_equal(out.numpy(), 1.0)
    with pytest.raises(LaunchError, match=f"over the {limit} bytes"):
        dynamic_user[1, 32, None, limit + 4](out)
