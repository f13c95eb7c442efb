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
        path = os.path.join(self.root, "jupyter_gpumem", "engine", "_build_native.py")
        spec = importlib.util.spec_from_file_location("_jupyter_gpumem_build_native", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        built = module.build()
        if built is None:
            return
        if version != "editable":
            build_data["force_include"][built] = "jupyter_gpumem/engine/" + os.path.basename(built)
        build_data["pure_python"] = False
        major, minor = sys.version_info[:2]
        build_data["tag"] = f"cp{major}{minor}-cp{major}{minor}-{_platform_tag()}"


def _platform_tag() -> str:
    import sysconfig

    return sysconfig.get_platform().replace("-", "_").replace(".", "_")
