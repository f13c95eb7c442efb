"""Sites in PyTorch stacks: C++ frames (``??:0``, ``.cpp``, ``.so``) and PyTorch's own Python
frames are passed over down to the user's line; on the fixtures (synthetic ones always, the ones
recorded on a GPU where present) and through ``python -m jupyter_gpumem summary``."""

from __future__ import annotations

import pathlib
import re

import pytest

from jupyter_gpumem.__main__ import main
from jupyter_gpumem.data.files import load_snapshot
from jupyter_gpumem.data.sites import AUTOGRAD_SITE, is_library_file, is_native_file, site_of

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
SNAPSHOTS = sorted(FIXTURES.glob("*torch*.pickle"))


def frame(filename: str, line: int = 1, name: str = "f") -> dict:
    return {"filename": filename, "line": line, "name": name}


def test_native_and_torch_frames_are_passed_over() -> None:
    frames = [frame("??", 0, "??"),
              frame("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 1130),
              frame("libtorch_cuda.so", 0),
              frame("/opt/pytorch/torch/nn/modules/linear.py", 125),  # not in site-packages
              frame("/home/u/train.py", 12),
              frame("<ipython-input-3-0a1b2c>", 2)]
    assert site_of(frames) == "train.py:12"
    assert site_of(frames[:4] + frames[5:]) == "cell [3] line 2"
    assert site_of(frames[:4]) is None
    assert site_of([frame("<string>", 4)]) == "<string>:4"  # code with no file is the user's
    assert is_native_file("??") and is_native_file("x.cpp") and is_native_file("<frozen os>")
    assert not is_native_file("a/b.py") and not is_native_file("<stdin>")
    assert is_library_file("C:\\envs\\torch\\functional.py")


def test_a_cell_file_is_the_users_whatever_its_name() -> None:
    assert site_of([frame("??", 0), frame("cell-7", 3)], {"cell-7": 7}) == "cell [7] line 3"


def test_fixtures_exist() -> None:
    assert FIXTURES / "synthetic_torch_all_stacks.pickle" in SNAPSHOTS


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.name)
def test_every_stack_of_a_torch_pickle_has_a_python_site(path) -> None:
    snap = load_snapshot(str(path))
    stacks = [e["frames"] for t in snap["device_traces"] for e in t if e["frames"]]
    stacks += [b["frames"] for s in snap["segments"] for b in s["blocks"] if b["frames"]]
    assert stacks
    for frames in stacks:
        site = site_of(frames)
        assert site is not None and "??" not in site
        if site == AUTOGRAD_SITE:  # autograd's own thread: C++ frames only, and they say so
            assert all(is_native_file(f["filename"]) for f in frames)
            continue
        assert re.fullmatch(r".+\.py:\d+|cell \[\d+\] line \d+", site), site


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.name)
def test_cli_summary_names_user_lines_not_cpp(path, capsys) -> None:
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    sites = out.split("top sites at the peak:\n", 1)[1].splitlines()
    assert sites
    assert not any("??" in line for line in sites)
    named = [line.split("×", 1)[1].strip() for line in sites]
    assert any(re.fullmatch(r".+\.py:\d+|cell \[\d+\] line \d+", s) for s in named), named


def test_synthetic_all_stacks_top_site() -> None:
    snap = load_snapshot(str(FIXTURES / "synthetic_torch_all_stacks.pickle"))
    first = snap["device_traces"][0][0]["frames"]
    assert first[0]["filename"] == "??"  # the C++ frames are there
    assert site_of(first) == "train.py:41"
