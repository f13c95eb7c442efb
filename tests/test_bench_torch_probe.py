"""``bench/torch_share_probe.py``: what it can do without a GPU.

The probe runs once on the lent GPU; here its self-test drives the C entry points as PyTorch
would, on a simulated device, through the same call log and summary the GPU run prints, and the
probe refuses clearly where PyTorch is missing.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from script_module import load_script

from jupyter_gpumem.engine.allocator import native_core_available

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "torch_share_probe.py"
needs_core = pytest.mark.skipif(not native_core_available() and os.environ.get("CI") != "true",
                                reason="the C core is not built")


def _probe() -> Any:
    return load_script(SCRIPT)


@needs_core
def test_self_test_logs_who_called_and_writes_the_log(tmp_path, capsys) -> None:
    probe = _probe()
    assert probe.main(["--self-test", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "PROBE self-test.calls OK 12 calls logged" in text
    assert "    3 x free | cached | GIL held | MainThread | stream 0x0" in text
    assert "    3 x free | cached | no GIL | worker | stream side" in text
    assert "    1 x alloc | slow | no GIL | worker | stream side" in text
    assert "PROBE self-test.books OK" in text
    assert not re.search(r"^PROBE \S+ FAIL", text, re.MULTILINE)
    assert text.splitlines()[-1].endswith(": 0 FAIL line(s), exit status 0")
    log = (tmp_path / "torch_share_probe.log").read_text()
    assert log.splitlines() == text.splitlines()
    from jupyter_gpumem.engine import _native

    assert _native.torch_bound(0) is None  # the self-test unbinds what it bound


def test_without_pytorch_the_probe_says_so(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    probe = _probe()
    status = probe.main([])
    text = capsys.readouterr().out
    assert status == 2
    if native_core_available():
        assert "PROBE preflight FAIL PyTorch is not importable here" in text
    else:
        assert "PROBE preflight FAIL the C core is not built" in text
    assert re.fullmatch(r"PROBE done in [\d.]+ s: 1 FAIL line\(s\), exit status 2",
                        text.splitlines()[-1])


def test_calls_are_summarized_by_thread_gil_and_stream() -> None:
    probe = _probe()
    me = threading.get_ident()
    rows = [
        (0, 0, 1, me, 0, 0, 0, 512, 0x10),
        (1, 0, 1, me, 0, 0, 0, 512, 0x10),
        (0, 1, 0, 12345, 999_999_999, 0, 0x7000, 512, 0x20),
        (0, 1, 0, 12345, 999_999_999, 0, 0x7000, 512, 0x30),
        (1, 2, 0, 12345, 999_999_999, 0, 0x7000, 512, 0x40),
    ]
    assert probe.summarize_calls(rows, {0x7000: "side"}) == [
        "    2 x alloc | slow | no GIL | C++ thread '?' (tid 999999999) | stream side",
        "    1 x alloc | cached | GIL held | MainThread | stream 0x0",
        "    1 x free | cached | GIL held | MainThread | stream 0x0",
        "    1 x free | unknown | no GIL | C++ thread '?' (tid 999999999) | stream side",
    ]
