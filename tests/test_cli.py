from __future__ import annotations

import pickle

import matplotlib.image
import numpy as np
from matplotlib.colors import to_rgb
from render_workload import BIG_SITE, recorded_snapshot
from view_assets import needs_dist

from jupyter_gpumem.__main__ import main
from jupyter_gpumem.data.files import save_snapshot
from jupyter_gpumem.render.plots import RESERVED_COLOR, STATE_COLORS

BLUE = STATE_COLORS["active_allocated"]


def _pixels(image: np.ndarray, color: str) -> int:
    return int((np.abs(image[..., :3] - to_rgb(color)) < 1.5 / 255).all(axis=-1).sum())


def test_summary_of_our_json(tmp_path, capsys) -> None:
    path = tmp_path / "s.json.gz"
    save_snapshot(recorded_snapshot(), path)
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "segments: 4 (0 small, 4 large), 1.1 GiB reserved" in out
    assert "1 OOMs" in out
    assert "top sites at the peak:" in out
    assert f"700 MiB       1×  {BIG_SITE}" in out


@needs_dist  # the HTML page embeds the built viewer
def test_render_png_and_html(tmp_path, capsys) -> None:
    path = tmp_path / "s.pickle"
    save_snapshot(recorded_snapshot(), path)
    assert main(["render", str(path), "-o", str(tmp_path / "o.png")]) == 0
    assert (tmp_path / "o.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["render", str(path), "-o", str(tmp_path / "o.html")]) == 0
    assert "https://" not in (tmp_path / "o.html").read_text()
    assert main(["render", str(path), "-o", str(tmp_path / "l.png"), "--plot", "segments"]) == 0
    # a trace draws the timeline by default (the reserved line is red, no block is blue);
    # --plot segments draws the blocks (blue allocated, grey cached) and no reserved line
    timeline, layout = (matplotlib.image.imread(tmp_path / name) for name in ("o.png", "l.png"))
    assert _pixels(timeline, RESERVED_COLOR) > 50 and _pixels(timeline, BLUE) == 0
    assert _pixels(layout, BLUE) > 10_000 and _pixels(layout, STATE_COLORS["inactive"]) > 10_000
    assert _pixels(layout, RESERVED_COLOR) == 0


def test_bad_files_are_clear_errors(tmp_path, capsys) -> None:
    evil = tmp_path / "e.pickle"
    evil.write_bytes(pickle.dumps(pickle.PickleError("x")))
    assert main(["summary", str(evil)]) == 1
    assert capsys.readouterr().err.startswith(f"jupyter-gpumem: {evil}: refusing to load")
    assert main(["summary", str(tmp_path / "missing.json")]) == 1
    assert capsys.readouterr().err == f"jupyter-gpumem: {tmp_path / 'missing.json'}: no such file\n"
    cut = tmp_path / "cut.json.gz"
    save_snapshot(recorded_snapshot(), cut)
    cut.write_bytes(cut.read_bytes()[:200])
    assert main(["render", str(cut), "-o", str(tmp_path / "o.html")]) == 1
    assert capsys.readouterr().err == (f"jupyter-gpumem: {cut}: truncated gzip data: it ends "
                                       "before the end of the compressed stream\n")


def test_subcommands_have_help(capsys) -> None:
    import pytest

    for command, words in (("demo", "simulated GPU"), ("summary", "top sites"),
                           ("render", "offline HTML"), ("replay", "--suggest")):
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0
        assert words in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "demo      run a training-like workload" in out and "summary   print segments" in out


def test_replay_says_what_the_magic_says(tmp_path, capsys) -> None:
    """``replay FILE`` prints the comparison (or the suggestion) that ``%gpumem replay FILE``
    and ``gm.compare`` give for the same file."""
    import pytest

    from jupyter_gpumem.whatif.compare import compare, suggest_config

    path = tmp_path / "s.json.gz"
    save_snapshot(recorded_snapshot(), path)
    assert main(["replay", str(path), "--config", "recorded",
                 "--config", "expandable_segments:True"]) == 0
    out = capsys.readouterr().out
    assert out == compare(str(path), [None, "expandable_segments:True"]).text() + "\n"
    assert out.startswith("gpumem replay: ") and "expandable_segments:True" in out
    assert main(["replay", str(path)]) == 0  # the recorded config and the default grid
    assert capsys.readouterr().out == compare(str(path)).text() + "\n"
    assert main(["replay", str(path), "--suggest"]) == 0
    assert capsys.readouterr().out == suggest_config(str(path)).text() + "\n"
    for bad, said in ((["--config", "foo:1"], "replay: --config foo:1: unknown allocator "
                       "option 'foo'"),
                      (["--capacity", "lots"], "replay: --capacity: "),
                      (["--suggest", "--config", "defaults"], "--suggest searches its own grid")):
        with pytest.raises(SystemExit) as exit_:
            main(["replay", str(path), *bad])
        assert exit_.value.code == 2
        assert said in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.json")]) == 1
    assert capsys.readouterr().err.startswith(f"jupyter-gpumem: {tmp_path / 'missing.json'}: ")


def test_suggest_with_no_fit_says_how_much_more_memory_would() -> None:
    from jupyter_gpumem.data.units import format_bytes
    from jupyter_gpumem.whatif.compare import suggest_config

    found = suggest_config(recorded_snapshot(), capacity=100 << 20)
    assert found.best is None and found.baseline_need is not None
    need = found.baseline_need
    assert found.lines()[0].endswith(
        f" The recorded config needs {format_bytes(need)}: it would fit with "
        f"{format_bytes(need - (100 << 20))} more memory than the 100 MiB the replay had.")


def test_replay_capacity_is_bounded_as_in_the_magic(tmp_path, capsys) -> None:
    """A device larger than the replay simulates is a usage error, as ``%gpumem replay`` says
    it; it raised OverflowError from the core."""
    import pytest

    largest = 1 << 62  # data.sizes.MAX_ALLOC_SIZE
    path = tmp_path / "s.json"
    save_snapshot(recorded_snapshot(), path)
    for too_big in ("99999999999999999999999", str(largest + 1)):
        with pytest.raises(SystemExit) as exit_:
            main(["replay", str(path), "--capacity", too_big])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            "python -m jupyter_gpumem: error: replay: --capacity must be between 1 B and "
            f"4194304 TiB, got '{too_big}'")
    assert main(["replay", str(path), "--capacity", str(largest)]) == 0
