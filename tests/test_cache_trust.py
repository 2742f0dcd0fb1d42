"""The disk cache trusts nothing its directory holds (issue 30.4): crafted metadata is
discarded and rebuilt, never a failed launch; only regular files are read, boundedly; the
directory is private; ``kaio cubins`` writes only inside its output directory. On CPU, with
a fake driver where a load is needed."""

from __future__ import annotations

import os
import stat
import threading
import types

import numpy as np
import pytest

import kaio
from kaio import f32, u32
from kaio.errors import CudaError
from kaio.runtime import cache as cache_mod
from kaio.runtime import module as module_mod
from kaio.runtime.cache import DiskCache, cache_key
from kaio.runtime.module import pack_entry, unpack_entry


@kaio.gpu_kernel(block_size=64)
def axpy(x: f32[:], y: f32[:], a: f32, n: u32):
    i = kaio.thread_idx_x() + kaio.block_idx_x() * 64
    if i < n:
        y[i] = a * x[i] + y[i]


def good_meta(kernel=axpy, layouts=("C", "C")) -> dict:
    spec = kernel.specialize({}, layouts)
    return {
        "name": kernel.__name__,
        "reqntid": [64, 1, 1],
        "maxntid": None,
        "cluster": None,
        "params": [
            [p.name, p.role, p.source, p.dim, p.value.type.name] for p in spec.function.params
        ],
        "variant": "sm_90 backend=ptx",
    }


def crafted(**changes) -> dict:
    meta = good_meta()
    for k, v in changes.items():
        if v is KeyError:
            del meta[k]
        else:
            meta[k] = v
    return meta


PARAMS = good_meta()["params"]
BAD_METAS = {
    "name missing": crafted(name=KeyError),
    "name not a string": crafted(name=7),
    "name with a path": crafted(name="../../evil"),
    "name with a slash": crafted(name="a/b"),
    "reqntid a string": crafted(reqntid="64"),
    "reqntid of two": crafted(reqntid=[64, 1]),
    "reqntid zero": crafted(reqntid=[0, 1, 1]),
    "reqntid a float": crafted(reqntid=[64.0, 1, 1]),
    "reqntid a bool": crafted(reqntid=[True, 1, 1]),
    "maxntid a string": crafted(maxntid="x"),
    "maxntid huge": crafted(maxntid=1 << 40),
    "cluster a dict": crafted(cluster={}),
    "cluster huge": crafted(cluster=1000),
    "params a dict": crafted(params={}),
    "params entry short": crafted(params=[PARAMS[0][:3]]),
    "params unknown type": crafted(params=[[*PARAMS[0][:4], "f128"], *PARAMS[1:]]),
    "params unknown role": crafted(params=[[PARAMS[0][0], "evil", *PARAMS[0][2:]], *PARAMS[1:]]),
    "params dim a string": crafted(params=[[*PARAMS[0][:3], "0", PARAMS[0][4]], *PARAMS[1:]]),
    "variant a list": crafted(variant=[]),
    "meta a list": [1, 2, 3],
}


@pytest.mark.parametrize("name", list(BAD_METAS))
def test_crafted_metadata_is_refused(name):
    assert unpack_entry(pack_entry(good_meta(), b"cubin")) is not None
    assert unpack_entry(pack_entry(BAD_METAS[name], b"cubin")) is None, name


def test_torn_metadata_length_is_refused():
    entry = bytearray(pack_entry(good_meta(), b"cubin"))
    entry[8:12] = (1 << 30).to_bytes(4, "little")  # a length past the payload
    assert unpack_entry(bytes(entry)) is None


# ----------------------------------------------------------------------------- loading
class FakeCu:
    """The three driver calls a cached load makes: a "cubin" is the text of the function
    names it holds."""

    class CUresult:
        CUDA_SUCCESS = 0

    def __init__(self):
        self.unloaded = []

    def cuModuleLoadData(self, cubin):
        if cubin.startswith(b"refused"):
            return (200, None)
        return (0, ("module", bytes(cubin)))

    def cuModuleGetFunction(self, module, name):
        return (0, 0xF00) if name in module[1].split() else (500, None)

    def cuModuleUnload(self, module):
        self.unloaded.append(module)
        return (0,)


def fake_check(result, what=""):
    if result[0] != 0:
        raise CudaError(f"{what} failed", "CUDA_ERROR_NOT_FOUND", int(result[0]))
    return None if len(result) == 1 else result[1]


@pytest.fixture
def fake_load(monkeypatch, tmp_path):
    """``module._load`` against a fake driver and a cache in tmp_path; yields (cache, load,
    builds): ``load()`` loads axpy's variant, ``builds`` counts the compiles."""
    cache = DiskCache(str(tmp_path / "cache"))
    fake = FakeCu()
    builds = []

    def build(ptx, name, arch, device):
        builds.append(name)
        return name.encode()  # a "cubin" holding that function

    def load_image(image, name, arch):
        return module_mod.check(fake.cuModuleLoadData(image), "load")

    monkeypatch.setattr(module_mod, "cu", fake)
    monkeypatch.setattr(module_mod, "check", fake_check)
    monkeypatch.setattr(module_mod, "driver_version", lambda: 12080)
    monkeypatch.setattr(module_mod, "check_ptx_supported", lambda *a: None)
    monkeypatch.setattr(module_mod, "build_image", build)
    monkeypatch.setattr(module_mod, "load_image", load_image)
    monkeypatch.setattr(module_mod, "disk_cache", lambda: cache)
    device = types.SimpleNamespace(ordinal=0, max_shared_per_block=48 << 10, name="fake")
    spec = axpy.specialize({}, ("C", "C"))
    key = cache_key(spec.key, "sm_90", 12080, module_mod.DRIVER_JIT)

    def load():
        return module_mod._load(spec, device, "sm_90")

    yield cache, key, load, builds, fake


BAD_LOADS = {
    **{k: (v, b"axpy") for k, v in BAD_METAS.items()},
    "name not in the cubin": (crafted(name="other"), b"axpy"),
    "params of another kernel": (crafted(params=PARAMS[:1]), b"axpy"),
    "params renamed": (crafted(params=[[p[0], p[1], "z", p[3], p[4]] for p in PARAMS]), b"axpy"),
    "scalar of another type": (
        crafted(params=[p if p[1] != "scalar" or p[0] != "a" else [*p[:4], "u32"] for p in PARAMS]),
        b"axpy",
    ),
    "strides of layout A": (
        crafted(params=good_meta(layouts=("A", "C"))["params"]),
        b"axpy",
    ),
    "cubin the driver refuses": (good_meta(), b"refused"),
}


@pytest.mark.parametrize("name", list(BAD_LOADS))
def test_a_crafted_entry_is_rebuilt_never_a_failed_launch(fake_load, name):
    """A checksum-valid entry whose metadata or cubin is wrong: the load compiles anew,
    replaces the entry, and the next load takes the new one from disk."""
    cache, key, load, builds, fake = fake_load
    meta, cubin = BAD_LOADS[name]
    cache.put(key, pack_entry(meta, cubin))
    loaded = load()
    assert not loaded.from_disk and builds == ["axpy"]
    assert loaded.name == "axpy" and [p.source for p in loaded.params][0] == "x"
    assert unpack_entry(cache.get(key))[0]["name"] == "axpy"  # the entry is replaced
    again = load()
    assert again.from_disk and builds == ["axpy"]
    if name == "name not in the cubin":
        assert fake.unloaded  # the refused module is unloaded, not leaked


@kaio.gpu_kernel(block_size=32)
def mixed(m: f32[:, :], flag: kaio.bool_, v: kaio.f16[:], k: kaio.i64, B: kaio.constexpr):
    if flag:
        m[0, 0] = f32(v[0]) + f32(k) + B


@pytest.mark.parametrize(
    "kernel, layouts",
    [(axpy, ("C", "C")), (axpy, ("A", "C")), (mixed, ("C", "C")), (mixed, ("A", "A"))],
)
def test_the_entries_a_compile_writes_fit_their_kernel(kernel, layouts):
    """The parameters a compiled kernel records are those ``fits_kernel`` expects (else every
    disk hit would be discarded): scalars of each type, 1-D and 2-D arrays, both layouts."""
    constexprs = {"B": 1.5} if kernel is mixed else {}
    spec = kernel.specialize(constexprs, layouts)
    params = [[p.name, p.role, p.source, p.dim, p.value.type.name] for p in spec.function.params]
    meta = {"name": kernel.__name__, "reqntid": None, "maxntid": None, "params": params}
    assert module_mod.valid_meta(meta)
    assert module_mod.fits_kernel(meta, kernel, layouts)
    other = ("C",) * len(layouts) if "A" in layouts else ("A",) * len(layouts)
    assert not module_mod.fits_kernel(meta, kernel, other)


def test_a_good_entry_loads_without_compiling(fake_load):
    cache, key, load, builds, _ = fake_load
    cache.put(key, pack_entry(good_meta(), b"axpy"))
    loaded = load()
    assert loaded.from_disk and builds == [] and loaded.reqntid == (64, 1, 1)


# ----------------------------------------------------------------------------- files
def planted(tmp_path) -> tuple[DiskCache, str]:
    cache = DiskCache(str(tmp_path / "cache"))
    cache.put("k", b"payload")
    return cache, cache.path("k")


def test_a_fifo_in_place_of_an_entry_is_removed_not_waited_on(tmp_path):
    cache, path = planted(tmp_path)
    os.remove(path)
    os.mkfifo(path)
    result = []
    reader = threading.Thread(target=lambda: result.append(cache.get("k")), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # unblock the old behaviour's open() before failing
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("reading a FIFO entry blocked")
    assert result == [None] and not os.path.lexists(path)


@pytest.mark.parametrize("target", ["/dev/zero", "entry"])
def test_a_symlinked_entry_is_removed_unread(tmp_path, target):
    """A symlink (to /dev/zero, or to a valid entry elsewhere) is not followed."""
    cache, path = planted(tmp_path)
    other = DiskCache(str(tmp_path / "other"))
    other.put("k", b"payload")
    os.remove(path)
    os.symlink(other.path("k") if target == "entry" else target, path)
    assert cache.get("k") is None
    assert not os.path.lexists(path)
    assert other.get("k") == b"payload"  # the target is untouched


def test_an_oversized_entry_is_removed_unread(tmp_path, monkeypatch):
    cache, path = planted(tmp_path)
    assert cache.get("k") == b"payload"
    monkeypatch.setattr(cache_mod, "MAX_ENTRY_BYTES", 4)
    assert cache.get("k") is None and not os.path.exists(path)


def test_a_directory_in_place_of_an_entry_is_a_miss(tmp_path):
    cache, path = planted(tmp_path)
    os.remove(path)
    os.mkdir(path)
    assert cache.get("k") is None


# ----------------------------------------------------------------------------- directory
def test_the_cache_directory_is_created_private(tmp_path):
    cache = DiskCache(str(tmp_path / "new" / "kaio"))
    cache.put("k", b"payload")
    assert stat.S_IMODE(os.stat(cache.directory).st_mode) == 0o700
    assert cache.get("k") == b"payload"


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722, 0o1777])
def test_a_directory_others_can_write_is_not_used(tmp_path, mode):
    """A cubin planted by another user would run in this process: such a directory is
    neither read nor written, with one warning."""
    cache, path = planted(tmp_path)
    os.chmod(cache.directory, mode)
    fresh = DiskCache(cache.directory)
    with pytest.warns(UserWarning, match="writable by other users"):
        assert fresh.get("k") is None
    fresh.put("j", b"other")  # no second warning, nothing written
    assert fresh.get("k") is None
    assert not os.path.exists(fresh.path("j")) and os.path.exists(path)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory away")
def test_a_directory_of_another_user_is_not_used(tmp_path):
    cache, _ = planted(tmp_path)
    os.chown(cache.directory, 12345, 12345)
    fresh = DiskCache(cache.directory)
    with pytest.warns(UserWarning, match="another user"):
        assert fresh.get("k") is None


# ----------------------------------------------------------------------------- kaio cubins
def test_kaio_cubins_writes_only_inside_its_directory(tmp_path, monkeypatch, capsys):
    """Names come from the cache: one crafted to climb out of --out is refused by the
    metadata check, and the file name is sanitized besides."""
    from kaio.cli import main, safe_file_name

    cache = DiskCache(str(tmp_path / "cache"))
    cubin = b"\x7fELF" + bytes(np.random.default_rng(3).integers(0, 256, 64, dtype=np.uint8))
    cache.put("a" * 64, pack_entry(crafted(name="../../evil"), cubin))
    cache.put("b" * 64, pack_entry(crafted(name="axpy"), cubin))
    out = tmp_path / "deep" / "out"
    assert main(["cubins", "--cache", cache.directory, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [f"axpy-{'b' * 12}.cubin"]
    assert not (tmp_path / "evil-aaaaaaaaaaaa.cubin").exists()
    capsys.readouterr()
    for name in ("../../evil", "a/b", ".hidden", "..", "", "x\0y"):
        safe = safe_file_name(name)
        assert "/" not in safe and "\0" not in safe and not safe.startswith(".") and safe
    assert safe_file_name("axpy-0123abcd.cubin") == "axpy-0123abcd.cubin"


# ----------------------------------------------------------------------------- tune.json
TUNE_TABLES = {
    "a list": [1, 2],
    "a string": "x",
    "entry a list": {"K": ["128x128", 1]},
    "entry a string": {"K": "128x128"},
    "config unknown": {"K": {"config": "1x1", "split": 1}},
    "config a list": {"K": {"config": ["128x128"], "split": 1}},
    "split zero": {"K": {"config": "16x128", "split": 0}},
    "split negative": {"K": {"config": "16x128", "split": -2}},
    "split a string": {"K": {"config": "16x128", "split": "2"}},
    "split a float": {"K": {"config": "16x128", "split": 2.5}},
    "split huge": {"K": {"config": "16x128", "split": 10**9}},
}


@pytest.fixture
def tune_table(tmp_path, monkeypatch):
    """Write a tune.json into a fresh cache directory; ``lookup`` then sees a fake GPU."""
    from kaio_ops import _arrays, tune

    monkeypatch.setenv("KAIO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tune, "_table", None)
    monkeypatch.setattr(_arrays, "gpu", lambda like: types.SimpleNamespace(name="GPU"))

    def write(table) -> None:
        import json

        (tmp_path / "tune.json").write_text(json.dumps(table))
        tune._table = None

    return write


@pytest.mark.parametrize("name", list(TUNE_TABLES))
def test_a_malformed_tune_table_is_ignored_with_one_warning(tune_table, name):
    """Issue 30.5: before, each of these made every GPU matmul raise (or divide by zero)."""
    from kaio_ops import tune
    from kaio_ops.matmul import Plan

    table = TUNE_TABLES[name]
    key = f"GPU|f16_async|{tune.bucket(16, 256, 1024)}"
    if isinstance(table, dict):
        table = {key: table["K"], f"GPU|f16_async|{tune.bucket(512, 512, 512)}": {
            "config": "64x64", "split": 1}}  # fmt: skip
    tune_table(table)
    with pytest.warns(UserWarning, match="malformed entr") as caught:
        assert tune.lookup(object(), "f16_async", 16, 256, 1024) is None
        tune.lookup(object(), "f16_async", 16, 256, 1024)
    assert len(caught) == 1
    if isinstance(table, dict):  # the good entry beside the bad one still counts
        assert tune.lookup(object(), "f16_async", 512, 512, 512) == Plan("64x64", 1)


def test_a_good_tune_table_loads_without_warning(tune_table, recwarn):
    from kaio_ops import tune
    from kaio_ops.matmul import Plan

    tune_table({f"GPU|f16_async|{tune.bucket(16, 256, 1024)}": {"config": "16x128", "split": 4}})
    assert tune.lookup(object(), "f16_async", 16, 256, 1024) == Plan("16x128", 4)
    assert tune.lookup(object(), "bf16_async", 16, 256, 1024) is None
    assert not [w for w in recwarn if "tune" in str(w.message)]
