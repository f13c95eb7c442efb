"""The test tree's files that CI never runs still start: its scripts, and the GPU modules.

CI has no GPU, so a GPU module that no longer imports, or a script of the test tree that a GPU
test runs as a child, was seen broken only on the next GPU run (issue 24: the PyTorch child of
``tests/gpu/test_expandable_gpu.py`` failed with ``No module named 'script_module'`` once the
test helpers moved). Here, found by scanning ``tests/``:

- every module with an ``if __name__ == "__main__":`` block is run as a script the way a GPU
  test runs it (``python tests/.../x.py``, the script's own folder first on its path, the
  project on ``PYTHONPATH``, and nothing of ``tests/``), with ``--help``: it must get past its
  imports, print its usage and exit 0;
- every GPU module (``tests/gpu/*.py`` and any module that uses ``pytest.mark.gpu``) is
  collected by pytest in a child process where fake CuPy and PyTorch packages stand in
  (``import_fakes``), so a module that ``pytest.importorskip("torch")`` skips here is imported
  all the same: each must give at least one test, and collecting must raise no error.

The fakes live only in that child; this session's modules are left as they were.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text("utf-8"), str(path))


def _is_main_block(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` at the top level of a module."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    sides = [test.left, *test.comparators]
    return (len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))


def _uses_gpu_mark(tree: ast.Module) -> bool:
    """Whether the code (not a string) names ``pytest.mark.gpu``."""
    return any(isinstance(node, ast.Attribute) and node.attr == "gpu"
               and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
               and isinstance(node.value.value, ast.Name) and node.value.value.id == "pytest"
               for node in ast.walk(tree))


def scripts() -> list[Path]:
    """The modules of ``tests/`` that run as scripts."""
    return [p for p in _modules() if any(_is_main_block(n) for n in _tree(p).body)]


def gpu_modules() -> list[Path]:
    """The test modules of ``tests/`` that need a GPU: under ``tests/gpu/`` or marked ``gpu``."""
    gpu = TESTS / "gpu"
    return [p for p in _modules() if p.name.startswith("test_")
            and (gpu in p.parents or _uses_gpu_mark(_tree(p)))]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _child_env() -> dict[str, str]:
    """This environment, with the project alone on ``PYTHONPATH`` (as the GPU tests start their
    children; a ``tests/`` folder on it would hide what the bug was) and no pytest options."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_the_scans_find_the_modules_ci_does_not_run() -> None:
    found = [_rel(p) for p in scripts()]
    assert "tests/gpu/test_expandable_gpu.py" in found and "tests/make_torch_fixtures.py" in found
    gpu = [_rel(p) for p in gpu_modules()]
    assert "tests/gpu/test_torch_parity.py" in gpu and "tests/test_demo.py" in gpu
    assert _rel(Path(__file__)) not in gpu  # it names the mark in strings only


# -- (a) every script gets past its imports and prints its usage ----------------------------------


@pytest.mark.parametrize("script", scripts(), ids=_rel)
def test_script_starts_and_prints_its_usage(script: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path,
                          env=_child_env(), capture_output=True, text=True, timeout=120)
    said = f"\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{_rel(script)} --help exited {proc.returncode}{said}"
    assert proc.stdout.lower().startswith("usage:"), said
    assert "Traceback" not in proc.stderr, said
    assert list(tmp_path.iterdir()) == []  # it only printed its usage


# -- (b) every GPU module imports, with fake GPU libraries, in a child ----------------------------


_COLLECT = """
import sys
sys.path.insert(0, {tests!r})
import import_fakes
sys.path.remove({tests!r})
import_fakes.install()
import pytest
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""


@functools.cache
def _collected() -> tuple[int, str]:
    """pytest's ``--collect-only`` of every GPU module, in one child with the fakes installed:
    its exit status and output."""
    code = _COLLECT.format(tests=str(TESTS))
    proc = subprocess.run([sys.executable, "-c", code, *map(_rel, gpu_modules())], cwd=ROOT,
                          env=_child_env(), capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("module", gpu_modules(), ids=_rel)
def test_gpu_module_imports_with_fake_gpu_libraries(module: Path) -> None:
    _, output = _collected()
    name = _rel(module)
    tests = [line for line in output.splitlines() if line.startswith(f"{name}::")]
    assert f"ERROR collecting {name}" not in output, _section(output, name)
    assert tests, f"pytest collected no test from {name}:\n{output[-6000:]}"


def test_collecting_the_gpu_modules_exits_0() -> None:
    status, output = _collected()  # 2: a collection error (a conftest's, say); 5: no tests
    assert status == 0, output[-6000:]


def _section(output: str, name: str) -> str:
    """The part of pytest's output about collecting ``name``."""
    start = output.find(f"ERROR collecting {name}")
    end = output.find("\n___", start + 1)
    return output[start:end if end > 0 else None][-6000:]


def test_the_fakes_stay_in_the_child() -> None:
    _collected()
    assert "import_fakes" not in sys.modules
    torch = sys.modules.get("torch")
    assert torch is None or type(torch).__name__ != "FakeModule"
    cupy = sys.modules.get("cupy")
    assert cupy is None or type(cupy).__name__ != "FakeModule"
