"""The allocator shim PyTorch calls (``csrc/torch_shim.cpp``, Note [The shim reads the error]):
its build, the choice between its builds (``runtime.torch_shim``), and its throw.

A C++ exception cannot cross ctypes (the process would abort), so the throw is checked by a
small C++ program that loads the shim as PyTorch does and catches what it throws: the "std"
build's ``std::runtime_error`` wherever a C++ compiler is, the "c10" build's
``c10::OutOfMemoryError`` and ``c10::Error`` where PyTorch (its headers and libc10) is installed
too. The shim's success path is called through ctypes over the real core.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest

from jupyter_gpumem import CachingAllocator, SimulatedDevice
from jupyter_gpumem.engine import _build_shim
from jupyter_gpumem.engine._build_shim import BuildResult, C10Build, build_shim, shim_command
from jupyter_gpumem.engine.allocator import native_core_available
from jupyter_gpumem.engine.oom import OOM_HEAD
from jupyter_gpumem.runtime import torch_shim
from jupyter_gpumem.runtime.torch_shim import c10_shim_name, choose_shim, first_error

pytestmark = pytest.mark.skipif(not native_core_available() and os.environ.get("CI") != "true",
                                reason="the C core is not built")
needs_cxx = pytest.mark.skipif(_build_shim.cxx_compiler() is None, reason="no C++ compiler")
MiB, GiB = 1 << 20, 1 << 30

HARNESS = r"""
#include <dlfcn.h>
#include <cstddef>
#include <cstdio>
#include <exception>
#ifdef WITH_C10
#include <c10/util/Exception.h>
#endif
static int oom = 1;
static void *fake_alloc(std::ptrdiff_t size, int, void *) {
    return size == 4096 ? reinterpret_cast<void *>(0x1000) : nullptr;
}
static const char *fake_error(int *is_oom) {
    *is_oom = oom;
    return oom ? "jupyter_gpumem: out of memory on device 0 (harness)" : "no core for device 7";
}
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { std::printf("dlopen failed: %s\n", dlerror()); return 2; }
    auto init = reinterpret_cast<int (*)(void *, void *)>(dlsym(h, "jupyter_gpumem_shim_init"));
    auto alloc = reinterpret_cast<void *(*)(std::size_t, int, void *)>(
        dlsym(h, "jupyter_gpumem_shim_alloc"));
    auto kind = reinterpret_cast<const char *(*)()>(dlsym(h, "jupyter_gpumem_shim_kind"));
    std::printf("kind %s\n", kind());
    try { alloc(4096, 0, nullptr); } catch (...) { std::printf("threw before init\n"); }
    std::printf("init %d %d\n", init(nullptr, nullptr),
                init(reinterpret_cast<void *>(&fake_alloc), reinterpret_cast<void *>(&fake_error)));
    std::printf("ok %p zero %p\n", alloc(4096, 0, nullptr), alloc(0, 0, nullptr));
    for (int round = 0; round < 2; round++, oom = 0) {
        try {
            alloc(1 << 20, 0, nullptr);
            std::printf("no throw\n");
        }
#ifdef WITH_C10
        catch (const c10::OutOfMemoryError &e) {
            std::printf("c10::OutOfMemoryError: %s\n", e.what_without_backtrace());
        } catch (const c10::Error &e) {
            std::printf("c10::Error: %s\n", e.what_without_backtrace());
        }
#endif
        catch (const std::exception &e) {
            std::printf("std::exception: %s\n", e.what());
        }
    }
    return 0;
}
"""


def run_harness(tmp_path: Path, shim: str, c10: C10Build | None = None) -> list[str]:
    cxx = _build_shim.cxx_compiler()
    assert cxx is not None
    source = tmp_path / "harness.cpp"
    source.write_text(HARNESS)
    exe = tmp_path / "harness"
    cmd = [*cxx, "-std=c++17", str(source), "-o", str(exe), "-ldl"]
    if c10 is not None:
        cmd = [*cxx, "-std=c++20", "-DWITH_C10",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(c10.cxx11_abi)}",
               *[f"-I{d}" for d in c10.include_dirs], str(source), "-o", str(exe), "-ldl",
               *[f"-L{d}" for d in c10.library_dirs],
               *[f"-Wl,-rpath,{d}" for d in c10.library_dirs], "-lc10"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    done = subprocess.run([str(exe), shim], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


@needs_cxx
def test_the_std_shim_throws_the_cores_text(tmp_path) -> None:
    built = build_shim(str(tmp_path / "std.so"))
    assert built.path is not None, built.log
    assert run_harness(tmp_path, built.path) == [
        "kind std",
        "threw before init",
        "init -1 0",
        "ok 0x1000 zero (nil)",
        "std::exception: jupyter_gpumem: out of memory on device 0 (harness)",
        "std::exception: no core for device 7",
    ]


def _installed_pytorch() -> C10Build | None:
    try:
        import torch
    except ImportError:
        return None
    build = torch_shim.c10_build_of(torch)
    return build if build.missing() is None else None


@needs_cxx
def test_the_c10_shim_throws_pytorchs_out_of_memory_error(tmp_path) -> None:
    c10 = _installed_pytorch()
    if c10 is None:
        pytest.skip("PyTorch (with its C++ headers) is not installed here")
    built = build_shim(str(tmp_path / "c10.so"), c10=c10)
    assert built.path is not None, built.log
    assert run_harness(tmp_path, built.path, c10)[-2:] == [
        "c10::OutOfMemoryError: jupyter_gpumem: out of memory on device 0 (harness)",
        "c10::Error: no core for device 7",
    ]


@needs_cxx
def test_the_shim_hands_out_the_cores_blocks(tmp_path) -> None:
    from jupyter_gpumem.engine import _native

    allocator = CachingAllocator(SimulatedDevice(GiB), native=True)
    _native.torch_bind(0, allocator.native_core)
    try:
        alloc, _free = _native.torch_entry_points()
        choice = choose_shim(None, alloc, _native.torch_error_entry(), folder=str(tmp_path),
                             packaged=str(tmp_path / "none.so"))
        assert choice.shim is not None and choice.shim.kind == "std", choice.reasons
        assert choice.shim.origin == "compiled now" and choice.shim.compile_seconds is not None
        call = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                ctypes.c_void_p)(choice.shim.alloc_address)
        ptr = call(3 * MiB, 0, None)
        assert allocator.owns(ptr)
        allocator.free(ptr)
    finally:
        _native.torch_bind(0, None)


def test_the_core_keeps_why_an_alloc_failed_for_the_thread() -> None:
    from jupyter_gpumem.engine import _native

    allocator = CachingAllocator(SimulatedDevice(GiB), native=True)
    _native.torch_bind(3, allocator.native_core)
    alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                             ctypes.c_void_p)(_native.torch_entry_points()[0])
    error = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))(
        _native.torch_error_entry())
    try:
        assert not alloc(2 * GiB, 3, None)
        is_oom = ctypes.c_int(-1)
        text = error(ctypes.byref(is_oom)).decode()
        assert text.startswith(OOM_HEAD + "0") and is_oom.value == 1  # the device of its report
        assert _native.torch_error_text() == (text, 1)
        assert not alloc(MiB, 9, None)  # no core for device 9 (and no missing() to make one)
        text, oom = _native.torch_error_text()
        assert "no allocator is bound to CUDA device 9" in text and oom == 0
    finally:
        _native.torch_bind(3, None)
        _native.torch_take_error()


def test_shim_commands_have_pytorchs_flags_only_for_c10() -> None:
    c10 = C10Build(("/t/include", "/t/include/api"), ("/t/lib",), cxx11_abi=False)
    cmd = shim_command(["g++"], "/o/x.so", c10=c10, standard="c++20")
    for flag in ("-DJG_SHIM_C10", "-D_GLIBCXX_USE_CXX11_ABI=0", "-I/t/include",
                 "-I/t/include/api", "-L/t/lib", "-Wl,-rpath,/t/lib", "-lc10", "-std=c++20"):
        assert flag in cmd
    plain = shim_command(["g++"], "/o/x.so")
    assert not [f for f in plain if "C10" in f or "c10" in f or f.startswith(("-I", "-L"))]


def test_c10_build_says_what_is_missing(tmp_path) -> None:
    build = C10Build((str(tmp_path),), (str(tmp_path),), True)
    assert "c10/util/Exception.h" in (build.missing() or "")
    (tmp_path / "c10" / "util").mkdir(parents=True)
    (tmp_path / "c10" / "util" / "Exception.h").write_text("")
    assert "libc10" in (build.missing() or "")
    (tmp_path / "libc10.so").write_text("")
    assert build.missing() is None


def test_the_c10_name_follows_what_the_binary_depends_on() -> None:
    a = C10Build(("/i",), ("/l",), True)
    names = {c10_shim_name("2.11.0+cu130", a), c10_shim_name("2.11.1", a),
             c10_shim_name("2.11.0+cu130", C10Build(("/i",), ("/l",), False)),
             c10_shim_name("2.11.0+cu130", C10Build(("/j",), ("/l",), True))}
    assert len(names) == 4
    assert c10_shim_name("2.11.0+cu130", a) == c10_shim_name("2.11.0+cu130", a)
    assert c10_shim_name("2.11.0+cu130", a).startswith("torch_shim-c10-2.11.0_cu130-")


class FakeTorchVersion:
    __version__ = "2.99"


def test_choose_tries_c10_then_the_packaged_std_then_compiles_std(tmp_path, monkeypatch) -> None:
    built: list[str] = []
    loaded: list[tuple[str, str, str]] = []
    c10 = C10Build(("/i",), ("/l",), True)

    def failing(target: str, c10: C10Build | None = None) -> BuildResult:
        built.append("c10" if c10 else "std")
        return BuildResult(None, 0.1, "x.cpp:1: error: no headers\ncompilation terminated.")

    def load(path, kind, origin, seconds, alloc, error):
        loaded.append((os.path.basename(path), kind, origin))
        return torch_shim.Shim(kind, path, 1, origin, seconds)

    monkeypatch.setattr(torch_shim, "load_shim", load)
    packaged = tmp_path / "packaged.so"
    packaged.write_text("")
    choice = choose_shim(FakeTorchVersion(), 1, 2, folder=str(tmp_path), packaged=str(packaged),
                         build=failing, c10=c10)
    assert built == ["c10"] and loaded == [("packaged.so", "std", "built with the package")]
    assert choice.reasons == ["c10 shim: compiling failed (x.cpp:1: error: no headers)"]
    packaged.unlink()
    built.clear()
    choice = choose_shim(FakeTorchVersion(), 1, 2, folder=str(tmp_path), packaged=str(packaged),
                         build=failing, c10=c10)
    assert choice.shim is None and built == ["c10", "std"] and len(choice.reasons) == 2

    def working(target: str, c10: C10Build | None = None) -> BuildResult:
        built.append("c10" if c10 else "std")
        Path(target).write_text("")
        return BuildResult(target, 1.5, "")

    built.clear()
    loaded.clear()
    first = choose_shim(FakeTorchVersion(), 1, 2, folder=str(tmp_path), build=working, c10=c10)
    again = choose_shim(FakeTorchVersion(), 1, 2, folder=str(tmp_path), build=working, c10=c10)
    assert built == ["c10"]  # compiled once, then found in the cache folder
    assert first.shim is not None and first.shim.origin == "compiled now"
    assert first.shim.compile_seconds == 1.5
    assert again.shim is not None and again.shim.origin == "cached"


def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(torch_shim.CACHE_ENV, str(tmp_path / "c"))
    assert torch_shim.cache_dir() == str(tmp_path / "c" / "torch_shim")
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the folder should be: a temporary folder instead
    monkeypatch.setenv(torch_shim.CACHE_ENV, str(blocked))
    folder = torch_shim.cache_dir()
    assert os.path.isdir(folder) and not folder.startswith(str(blocked))


def test_first_error_picks_the_compilers_error_line() -> None:
    assert first_error("a.cpp: In function\na.cpp:3: error: boom\ncompilation terminated.") == (
        "a.cpp:3: error: boom")
    assert first_error("ld: cannot find -lc10") == "ld: cannot find -lc10"
    assert first_error("") == "no output"


def test_the_c10_folders_without_cpp_extension(tmp_path, monkeypatch) -> None:
    """torch.utils.cpp_extension imports setuptools; without it the folders are the torch
    package's own."""
    import sys
    import types

    fake = types.SimpleNamespace(__file__=str(tmp_path / "torch" / "__init__.py"),
                                 _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=False))
    monkeypatch.setitem(sys.modules, "torch.utils", None)  # import torch.utils fails
    build = torch_shim.c10_build_of(fake)
    assert build.include_dirs[0] == str(tmp_path / "torch" / "include")
    assert build.library_dirs == (str(tmp_path / "torch" / "lib"),)
    assert build.cxx11_abi is False
