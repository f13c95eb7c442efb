"""Compile the allocator shim PyTorch calls (``csrc/torch_shim.cpp``): Note [The shim reads the
error] in ``csrc/torch.c`` says why there is one.

Two builds of the one source:

- "c10": against an installed PyTorch's headers (``torch/include``, in every torch wheel),
  linked to its ``libc10``: out of memory raises ``torch.OutOfMemoryError``. Made on the user's
  machine when PyTorch first shares our cache (``runtime.torch_shim``), with the flags PyTorch's
  own extensions use (its C++ standard, its ``_GLIBCXX_USE_CXX11_ABI``);
- "std": no PyTorch needed, built with the package when a C++ compiler is there
  (``python -m jupyter_gpumem.engine._build_native`` and the wheel's build hook):
  ``std::runtime_error``, a RuntimeError in PyTorch, with the same message.

Nothing here imports PyTorch: the caller passes its paths (``C10Build``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM_SOURCE = os.path.join(HERE, "csrc", "torch_shim.cpp")
#: The "std" shim built with the package, beside the C core.
STD_SHIM = os.path.join(HERE, "_torch_shim_std" + (
    ".dylib" if sys.platform == "darwin" else ".so"))
#: C++ standards tried in order: PyTorch 2.10 and later need C++20 in their headers, older ones
#: C++17 (a compiler without -std=c++20 gets the second try).
STANDARDS = ("c++20", "c++17")


@dataclass(frozen=True)
class C10Build:
    """What a "c10" shim is compiled against: an installed PyTorch's include and library
    folders and its C++ ABI flag (``torch._C._GLIBCXX_USE_CXX11_ABI``)."""

    include_dirs: tuple[str, ...]
    library_dirs: tuple[str, ...]
    cxx11_abi: bool

    def missing(self) -> str | None:
        """Why this PyTorch cannot build the shim (no headers, no libc10), or None."""
        if not any(os.path.exists(os.path.join(d, "c10", "util", "Exception.h"))
                   for d in self.include_dirs):
            return (f"PyTorch's C++ headers (c10/util/Exception.h) are not in "
                    f"{', '.join(self.include_dirs) or 'any include folder'}")
        if not any(os.path.exists(os.path.join(d, _libc10())) for d in self.library_dirs):
            return f"{_libc10()} is not in {', '.join(self.library_dirs) or 'any folder'}"
        return None


@dataclass(frozen=True)
class BuildResult:
    """A compile: the library made (None when it failed), how long it took, and the
    compiler's output of the last attempt (its error, when it failed)."""

    path: str | None
    seconds: float
    log: str
    command: tuple[str, ...] = ()


def _libc10() -> str:
    return "libc10.dylib" if sys.platform == "darwin" else "libc10.so"


def cxx_compiler() -> list[str] | None:
    """The C++ compiler command: $CXX, Python's build config's CXX, else c++/g++/clang++ on
    PATH; None when there is none."""
    for candidate in (os.environ.get("CXX"), sysconfig.get_config_var("CXX"), "c++", "g++",
                      "clang++"):
        if candidate:
            argv = shlex.split(candidate)
            if argv and shutil.which(argv[0]):
                return argv
    return None


def shim_command(cxx: list[str], target: str, *, c10: C10Build | None = None,
                 standard: str = "c++17", source: str = SHIM_SOURCE) -> list[str]:
    """The compile-and-link command of one shim build."""
    cmd = [*cxx, "-O2", "-fPIC", "-shared", f"-std={standard}", "-fvisibility=hidden",
           "-Wall", "-Wextra"]
    if sys.platform == "darwin":
        cmd += ["-undefined", "dynamic_lookup"]
    if c10 is not None:
        cmd += ["-DJG_SHIM_C10", f"-D_GLIBCXX_USE_CXX11_ABI={int(c10.cxx11_abi)}"]
        cmd += [f"-I{d}" for d in c10.include_dirs]
    cmd += [source, "-o", target]
    if c10 is not None:
        for d in c10.library_dirs:  # found again at load time, wherever the process runs
            cmd += [f"-L{d}", f"-Wl,-rpath,{d}"]
        cmd += ["-lc10"]
    return cmd


def build_shim(target: str, *, c10: C10Build | None = None, cxx: list[str] | None = None,
               source: str = SHIM_SOURCE) -> BuildResult:
    """Compile the shim to ``target`` (written whole or not at all: built beside it, then
    renamed), trying each of ``STANDARDS``. ``c10``: the "c10" build against that PyTorch;
    None: the "std" build."""
    started = time.perf_counter()
    cxx = cxx if cxx is not None else cxx_compiler()
    if cxx is None:
        return BuildResult(None, 0.0, "no C++ compiler found (set CXX, or install g++ or "
                                      "clang++)")
    if c10 is not None and (why := c10.missing()) is not None:
        return BuildResult(None, 0.0, why)
    folder = os.path.dirname(os.path.abspath(target)) or "."
    os.makedirs(folder, exist_ok=True)
    log = ""
    cmd: list[str] = []
    for standard in STANDARDS:
        fd, partial = tempfile.mkstemp(prefix=".shim-", suffix=".so", dir=folder)
        os.close(fd)
        cmd = shim_command(cxx, partial, c10=c10, standard=standard, source=source)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as exc:
            done = subprocess.CompletedProcess(cmd, 127, "", f"{exc}")
        if done.returncode == 0:
            os.chmod(partial, 0o755)  # mkstemp's file is the owner's alone
            os.replace(partial, target)
            return BuildResult(target, time.perf_counter() - started, done.stderr, tuple(cmd))
        os.unlink(partial)
        log = done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}"
    return BuildResult(None, time.perf_counter() - started, log, tuple(cmd))


if __name__ == "__main__":
    result = build_shim(sys.argv[1] if len(sys.argv) > 1 else STD_SHIM)
    print(result.path or f"not built: {result.log}")
    sys.exit(0 if result.path else 1)
