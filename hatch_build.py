"""Build hook: compile the allocator's C core into the wheel (or in place, for editable installs).

Without a compiler the package stays pure Python and uses the Python core.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class NativeCoreHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        module = self._load("_build_native")
        built = module.build()
        if built is None:
            return
        # the allocator shim PyTorch calls, in its build that needs no PyTorch (if a C++
        # compiler is there; sharing the cache with PyTorch compiles one otherwise)
        shims = self._load("_build_shim")
        shim = shims.build_shim(shims.STD_SHIM).path
        if version != "editable":
            for path in (built, shim):
                if path is not None:
                    build_data["force_include"][path] = ("jupyter_gpumem/engine/"
                                                         + os.path.basename(path))
        build_data["pure_python"] = False
        major, minor = sys.version_info[:2]
        build_data["tag"] = f"cp{major}{minor}-cp{major}{minor}-{_platform_tag()}"

    def _load(self, name: str) -> Any:
        """``jupyter_gpumem/engine/<name>.py``, loaded by path (the package is not importable
        while it is being built)."""
        path = os.path.join(self.root, "jupyter_gpumem", "engine", name + ".py")
        spec = importlib.util.spec_from_file_location(f"_jupyter_gpumem{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # dataclasses look their module up in sys.modules while the class body runs
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            del sys.modules[spec.name]
        return module


def _platform_tag() -> str:
    import sysconfig

    return sysconfig.get_platform().replace("-", "_").replace(".", "_")
