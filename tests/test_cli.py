from __future__ import annotations

import pickle

from render_workload import recorded_snapshot

from jupyter_gpumem.__main__ import main
from jupyter_gpumem.data.files import save_snapshot


def test_summary_of_our_json(tmp_path, capsys) -> None:
    path = tmp_path / "s.json.gz"
    save_snapshot(recorded_snapshot(), path)
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "segments: 4 (0 small, 4 large), 1.1 GiB reserved" in out
    assert "1 OOMs" in out
    assert "top sites at the peak:" in out
    assert "700 MiB       1×  render_workload.py:" in out


def test_render_png_and_html(tmp_path, capsys) -> None:
    path = tmp_path / "s.pickle"
    save_snapshot(recorded_snapshot(), path)
    assert main(["render", str(path), "-o", str(tmp_path / "o.png")]) == 0
    assert (tmp_path / "o.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["render", str(path), "-o", str(tmp_path / "o.html")]) == 0
    assert "https://" not in (tmp_path / "o.html").read_text()
    assert main(["render", str(path), "-o", str(tmp_path / "l.png"), "--plot", "segments"]) == 0


def test_bad_files_are_clear_errors(tmp_path, capsys) -> None:
    evil = tmp_path / "e.pickle"
    evil.write_bytes(pickle.dumps(pickle.PickleError("x")))
    assert main(["summary", str(evil)]) == 1
    assert "refusing to load" in capsys.readouterr().err
    assert main(["summary", str(tmp_path / "missing.json")]) == 1


def test_demo_still_works(capsys) -> None:
    assert main(["demo"]) == 0
    assert "memory summary" in capsys.readouterr().out
