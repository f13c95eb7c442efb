"""Compile the allocator's C core (``csrc/*.c``) into the ``_native`` extension beside it.

Used by the package build (``hatch_build.py``) and by hand: ``python -m
jupyter_gpumem.engine._build_native [TARGET]``. ``JUPYTER_GPUMEM_CFLAGS`` adds compiler flags (CI
builds a copy with ``-fsanitize=address,undefined`` this way: ``.ci/sanitize``). Without a C
compiler nothing is built and the package runs on its pure-Python core;
``CachingAllocator(...).native`` tells which core is in use. Run as a script, it also builds the
allocator shim PyTorch calls, in its build that needs no PyTorch (``_build_shim``; without a C++
compiler there is none, and sharing our cache with PyTorch compiles one against PyTorch then).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(os.path.join(HERE, "csrc", name)
                 for name in os.listdir(os.path.join(HERE, "csrc")) if name.endswith(".c"))
#: A build for this interpreter: the core uses CPython's frame API, outside the stable ABI.
TARGET = os.path.join(HERE, "_native" + str(sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
#: Extra compiler flags, split as a shell would, added after ours (so -O1 overrides -O2).
CFLAGS_ENV = "JUPYTER_GPUMEM_CFLAGS"


def compiler() -> list[str] | None:
    """The C compiler command, from $CC, Python's build config, or cc/gcc/clang on PATH."""
    for candidate in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if candidate:
            argv = shlex.split(candidate)
            if argv and shutil.which(argv[0]):
                return argv
    return None


def build(target: str = TARGET) -> str | None:
    """Compile the C core to ``target``; return its path, or None (with a reason on stderr)."""
    cc = compiler()
    include = sysconfig.get_paths()["include"]
    if cc is None:
        print("jupyter_gpumem: no C compiler found; using the pure-Python core", file=sys.stderr)
        return None
    if not os.path.exists(os.path.join(include, "Python.h")):
        print(f"jupyter_gpumem: no Python.h in {include}; using the pure-Python core",
              file=sys.stderr)
        return None
    flags = ["-O2", "-fPIC", "-shared", "-std=c11", "-fvisibility=hidden", "-Wall", "-Wextra",
             "-Wno-unused-parameter"]
    if sys.platform == "darwin":
        flags += ["-undefined", "dynamic_lookup"]
    flags += shlex.split(os.environ.get(CFLAGS_ENV, ""))
    cmd = [*cc, *flags, f"-I{include}", *SOURCES, "-o", target]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        print(f"jupyter_gpumem: building the C core failed; using the pure-Python core\n"
              f"{result.stderr}", file=sys.stderr)
        return None
    return target


if __name__ == "__main__":
    path = build(*sys.argv[1:2])
    print(path or "not built")
    if path and not sys.argv[1:2]:  # the package's own build: the shim beside the core
        from jupyter_gpumem.engine import _build_shim

        shim = _build_shim.build_shim(_build_shim.STD_SHIM)
        print(shim.path or f"allocator shim for PyTorch not built: {shim.log.splitlines()[-1]}")
    sys.exit(0 if path else 1)
