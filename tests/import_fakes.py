"""Stand-ins for the GPU libraries, so that a GPU test module can be imported where they are
missing (no PyTorch on CI) or see no device: ``install()`` puts a finder first on
``sys.meta_path`` that serves ``cupy``, ``cupyx``, ``cupy_backends`` and ``torch``, and every
submodule of theirs, as a ``FakeModule``.

Every attribute of a fake module is a fake class, whose attributes, items and calls are fake
classes again, so that what a module does with the library while it is imported
(``torch.float32``, ``class Net(torch.nn.Module)``, ``@torch.no_grad()``) runs; nothing behaves
like the library. ``fake_torch`` and ``cupy_like`` are the fakes that behave.

For child processes only (``tests/test_test_modules.py`` installs it in the pytest it starts):
it takes the real libraries' place for the rest of the process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

#: The packages faked: CuPy (and its extras and backends) and PyTorch.
FAKED = ("cupy", "cupyx", "cupy_backends", "torch")
VERSION = "0.0+fake"


class _FakeType(type):
    """A fake class: attributes, items and calls give more fake classes."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return fake(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return fake(f"{cls.__qualname__}()")

    def __getitem__(cls, key: Any) -> Any:
        return fake(f"{cls.__qualname__}[]")

    def __iter__(cls) -> Iterator[Any]:
        return iter(())


def fake(name: str) -> Any:
    """A new fake class named ``name``."""
    return _FakeType(name.rsplit(".", 1)[-1], (), {"__qualname__": name, "__module__": "fake"})


class FakeModule(types.ModuleType):
    """A module of a faked package: any attribute that is not a submodule is a fake class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return fake(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in FAKED:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = FakeModule(spec.name)
        module.__version__ = VERSION  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    """Serve the faked packages from now on, in place of any already imported."""
    for name in [n for n in sys.modules if n.partition(".")[0] in FAKED]:
        del sys.modules[name]
    sys.meta_path.insert(0, _Finder())
