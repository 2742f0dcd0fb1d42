"""The ``kaio`` command: ``kaio ptx FILE::KERNEL``, ``kaio ir FILE::KERNEL``, ``kaio info``,
``kaio cubins [NAME ...] --out DIR``."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys

from kaio.errors import CompileError, LaunchError
from kaio.kernel import Kernel
from kaio.llvm import LLVMUnavailable
from kaio.types import PACKED_TYPES, SCALAR_TYPES


def load_kernel(target: str) -> Kernel:
    """Import ``path/to/file.py::name`` and return the kernel named there."""
    path, sep, name = target.partition("::")
    if not sep or not name:
        raise SystemExit(f"kaio: expected FILE.py::KERNEL, got {target!r}")
    if not os.path.exists(path):
        raise SystemExit(f"kaio: no such file: {path}")
    module_name = f"_kaio_cli_{os.path.splitext(os.path.basename(path))[0]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    kernel = getattr(module, name, None)
    if not isinstance(kernel, Kernel):
        found = [k for k, v in vars(module).items() if isinstance(v, Kernel)]
        raise SystemExit(
            f"kaio: {name!r} is not a @kaio.gpu_kernel in {path} "
            f"(kernels there: {', '.join(found) or 'none'})"
        )
    return kernel


_SCALAR_NAMES = {**SCALAR_TYPES, **PACKED_TYPES}  # -D DT=f16 (or kaio.f16): a dtype constexpr


def _constexprs(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"kaio: constexpr values are NAME=VALUE, got {pair!r}")
        try:
            out[key] = int(value, 0)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = _SCALAR_NAMES.get(value.removeprefix("kaio."), value)
    return out


def safe_file_name(name: str) -> str:
    """``name`` made a plain file name: characters other than letters, digits, ``_ - . $``
    become ``_``, and a leading dot too, so it never names another directory (``../``) or a
    hidden file."""
    name = re.sub(r"[^\w.$-]", "_", name, flags=re.ASCII)
    return "_" + name[1:] if name.startswith(".") or not name else name


def write_cubins(names: list[str], out: str, cache: str | None) -> int:
    """``kaio cubins``: each cached kernel (of ``names``, or all) as ``out/NAME-KEY.cubin``,
    one line each on stdout; 1 when none matched."""
    from kaio.runtime.cache import DiskCache
    from kaio.runtime.module import cached_cubins

    disk = DiskCache(cache)
    entries = [e for e in cached_cubins(disk) if not names or e[0]["name"] in names]
    if not entries:
        wanted = f"kernels named {', '.join(names)}" if names else "kernels"
        print(
            f"kaio: no cubins of {wanted} in the cache at {disk.directory}: run them on a GPU "
            "first with KAIO_PTXAS=auto (the driver's JIT keeps no cubin; KAIO_CACHE_DIR "
            "names the cache)",
            file=sys.stderr,
        )
        return 1
    os.makedirs(out, exist_ok=True)
    for meta, key, cubin in entries:
        path = os.path.join(out, safe_file_name(f"{meta['name']}-{key[:12]}.cubin"))
        with open(path, "wb") as f:
            f.write(cubin)
        print(f"{path}  {len(cubin)} bytes  {meta.get('variant', '')}".rstrip())
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="kaio", description="Inspect and run kaio kernels.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("ptx", "print a kernel's PTX"), ("ir", "print a kernel's typed IR")):
        p = sub.add_parser(name, help=text)
        p.add_argument("target", help="path/to/file.py::kernel_name")
        p.add_argument(
            "-D",
            dest="constexprs",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="a constexpr parameter's value",
        )
        if name == "ptx":
            p.add_argument("--arch", default=None, help="target, e.g. sm_80, sm_90 (default sm_90)")
            p.add_argument(
                "--backend", choices=("ptx", "llvm"), default=None, help="the code generator"
            )
    sub.add_parser("info", help="driver, GPUs and cache directory")
    p = sub.add_parser(
        "cubins", help="write the cubins the driver built (the disk cache) for cuobjdump -sass"
    )
    p.add_argument("names", nargs="*", help="only these kernels (default: all)")
    p.add_argument("--out", required=True, help="directory for NAME-KEY.cubin files")
    p.add_argument("--cache", default=None, help="cache directory (default: KAIO_CACHE_DIR)")
    args = parser.parse_args(argv)
    if args.command == "info":
        from kaio.runtime.info import info

        print(info())
        return 0
    if args.command == "cubins":
        return write_cubins(args.names, args.out, args.cache)
    kernel = load_kernel(args.target)
    constexprs = _constexprs(args.constexprs)
    missing = [n for n in kernel.constexpr_names if n not in constexprs]
    if missing:
        print(
            f"kaio: {kernel.__name__} has constexpr parameter(s) {', '.join(missing)} without a "
            f"value: pass each with -D, e.g. -D {missing[0]}=VALUE",
            file=sys.stderr,
        )
        return 1
    try:
        if args.command == "ptx":
            text = kernel.ptx(arch=args.arch, backend=args.backend, **constexprs)
        else:
            text = kernel.ir(**constexprs)
    except (CompileError, LLVMUnavailable) as e:
        print(e, file=sys.stderr)
        return 1
    except LaunchError as e:  # a wrong constexpr name, say: one line, no traceback
        print(f"kaio: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
