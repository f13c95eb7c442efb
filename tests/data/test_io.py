from __future__ import annotations

import os
import pickle

import pytest
from render_workload import recorded_snapshot

from jupyter_gpumem.data.files import (
    PICKLE_PROTOCOL,
    SnapshotFileError,
    SnapshotFormatError,
    UnsafePickleError,
    load_snapshot,
    loads_pickle,
    save_snapshot,
)


def _plain(obj):
    """Tuples become lists in JSON; compare modulo that."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


@pytest.mark.parametrize("name", ["s.json", "s.json.gz", "s.pickle", "s.pkl.gz"])
def test_round_trip(tmp_path, name: str) -> None:
    snap = recorded_snapshot()
    path = tmp_path / name
    save_snapshot(snap, path)
    assert _plain(load_snapshot(path)) == _plain(snap)


def test_pickle_is_protocol_4_with_plain_data_only(tmp_path) -> None:
    path = tmp_path / "s.pickle"
    save_snapshot(recorded_snapshot(), path)
    data = path.read_bytes()
    assert data[:2] == bytes([0x80, PICKLE_PROTOCOL])
    import pickletools

    ops = {op.name for op, _, _ in pickletools.genops(data)}
    assert not ops & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ"}


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED_BY_PICKLE",))


def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "x": _Payload()},
                                  protocol=4))
    refused = r"evil\.pickle: refusing to load (os|posix)\.system"
    with pytest.raises(SnapshotFileError, match=refused):
        load_snapshot(path)
    assert not (tmp_path / "PWNED_BY_PICKLE").exists()
    # named .json, it is still recognised as a pickle and refused
    (tmp_path / "evil.json").write_bytes(path.read_bytes())
    with pytest.raises(SnapshotFileError, match="refusing"):
        load_snapshot(tmp_path / "evil.json")
    assert not (tmp_path / "PWNED_BY_PICKLE").exists()


def test_plain_pickles_load() -> None:
    obj = {"a": [1, 2.5, None, True, "x", b"y", (1, 2)], "b": {3: 4}}
    assert loads_pickle(pickle.dumps(obj, protocol=2)) == obj
    with pytest.raises(UnsafePickleError, match=r"refusing to load builtins\.eval"):
        loads_pickle(pickle.dumps(eval))


def test_pytorch_style_pickle_without_block_addresses(tmp_path) -> None:
    torch_like = {"segments": [{
        "device": 0, "address": 1 << 20, "total_size": 2 << 20, "allocated_size": 512,
        "active_size": 512, "requested_size": 100, "stream": 0, "segment_type": "small",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
        "blocks": [{"size": 512, "requested_size": 100, "state": "active_allocated",
                    "frames": []},
                   {"size": (2 << 20) - 512, "requested_size": 0, "state": "inactive",
                    "frames": []}]}],
        "device_traces": [[{"action": "alloc", "addr": 1 << 20, "size": 100, "stream": 0,
                            "time_us": 5, "frames": []}]]}
    path = tmp_path / "torch.pickle"
    path.write_bytes(pickle.dumps(torch_like, protocol=4))
    snap = load_snapshot(path)
    assert [b["address"] for b in snap["segments"][0]["blocks"]] == [1 << 20, (1 << 20) + 512]


def test_not_a_snapshot(tmp_path) -> None:
    (tmp_path / "x.json").write_text("[1, 2")
    with pytest.raises(SnapshotFormatError):
        load_snapshot(tmp_path / "x.json")
    (tmp_path / "y.json").write_text('{"a": 1}')
    with pytest.raises(SnapshotFormatError):
        load_snapshot(tmp_path / "y.json")


def test_limits_by_keyword_and_environment(tmp_path, monkeypatch) -> None:
    from jupyter_gpumem.data.schema import LoadLimits

    path = tmp_path / "s.json.gz"
    save_snapshot(recorded_snapshot(), path)
    assert load_snapshot(path, limits=LoadLimits(max_segments=4))["segments"]
    with pytest.raises(SnapshotFileError, match=r"more than 3 segments \(limit max_segments\); "
                       "raise it with JUPYTER_GPUMEM_LOAD_LIMITS=max_segments:N"):
        load_snapshot(path, limits=LoadLimits(max_segments=3))
    monkeypatch.setenv("JUPYTER_GPUMEM_LOAD_LIMITS", "max_bytes:1KiB")
    with pytest.raises(SnapshotFileError, match=r"more than 1\.0 KiB once decompressed"):
        load_snapshot(path)
    monkeypatch.setenv("JUPYTER_GPUMEM_LOAD_LIMITS", "max_bites:1")
    with pytest.raises(ValueError, match="JUPYTER_GPUMEM_LOAD_LIMITS: unknown limit 'max_bites'"):
        load_snapshot(path)
    assert LoadLimits.parse("max_bytes:4GiB, max_events:20000000") == LoadLimits(
        max_bytes=4 << 30, max_events=20_000_000)


def test_sizes_are_read_exactly() -> None:
    """Sizes are parsed without a float between (2**63 - 1 read as 2**63 was refused by the
    bounds, 2**62 + 1 taken as 2**62 passed them), and huge exponents cost no time."""
    from jupyter_gpumem.data.schema import LoadLimits
    from jupyter_gpumem.data.units import parse_bytes

    assert parse_bytes("9223372036854775807") == (1 << 63) - 1
    assert parse_bytes("4611686018427387905") == (1 << 62) + 1
    assert parse_bytes("1.5KiB") == 1536 and parse_bytes("0.5") == 0
    assert parse_bytes("1e-99999999GiB") == 0
    for text in ("1e31", "1e99999999", "1e999GiB"):
        with pytest.raises(ValueError, match=f"not a size: '{text}' is too large"):
            parse_bytes(text)
    assert LoadLimits.parse("max_bytes:9223372036854775807").max_bytes == (1 << 63) - 1


def test_text_is_cut_at_load_and_a_shared_string_counts_at_each_frame(tmp_path) -> None:
    """A pickle's memo lets one string stand for many: it counts at every frame using it
    against max_bytes; a string longer than MAX_TEXT is cut, and a lone surrogate (no output
    encodes it) replaced."""
    from hostile_files import base_snapshot

    from jupyter_gpumem.data.schema import MAX_TEXT, LoadLimits

    text = "x" * 100_000
    snap = base_snapshot()
    snap["device_traces"][0] = [
        {"action": "alloc", "addr": 1 << 20, "size": 100, "stream": 0, "time_us": i,
         "frames": [{"filename": text, "line": i, "name": "f\ud800"}]} for i in range(100)]
    snap["jupyter_gpumem"] = {"device_name": text, "tasks": [[text]] * 3}
    path = tmp_path / "shared.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    assert path.stat().st_size < 200_000
    frames = 100 * len(text + "f\ud800") + len("train.py<module>")  # and the block's frame
    expanded = frames + len("device_name" "tasks") + 4 * len(text)
    with pytest.raises(SnapshotFileError, match=f"holds more than {expanded - 1:,} characters "
                       r"of text \(a string shared by several stack frames or places counts "
                       r"at each\) \(limit max_bytes\)"):
        load_snapshot(path, limits=LoadLimits(max_bytes=expanded - 1))
    loaded = load_snapshot(path, limits=LoadLimits(max_bytes=expanded))
    cut = "x" * (MAX_TEXT - 1) + "…"
    assert {f["filename"] for e in loaded["device_traces"][0] for f in e["frames"]} == {cut}
    assert {f["name"] for e in loaded["device_traces"][0] for f in e["frames"]} == {"f\ufffd"}
    assert loaded["jupyter_gpumem"] == {"device_name": cut, "tasks": [[cut]] * 3}


def test_shared_frames_load_and_are_counted_per_reference(tmp_path) -> None:
    from jupyter_gpumem.data.schema import LoadLimits

    frames = [{"filename": "train.py", "line": 1, "name": "f"}] * 3
    events = [{"action": "alloc", "addr": 512 * i, "size": 512, "stream": 0, "time_us": i,
               "frames": frames} for i in range(10)]
    path = tmp_path / "t.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4))
    assert len(load_snapshot(path, limits=LoadLimits(max_frames=30))["device_traces"][0]) == 10
    with pytest.raises(SnapshotFileError, match="more than 29 stack frame references"):
        load_snapshot(path, limits=LoadLimits(max_frames=29))


def test_the_documented_trace_loads() -> None:
    snap = load_snapshot(os.path.join(os.path.dirname(__file__), "..", "..", "docs",
                                      "h200-trace.json.gz"))
    assert len(snap["device_traces"][0]) == 1477


def test_file_errors_and_limits_are_public() -> None:
    import jupyter_gpumem as gm
    from jupyter_gpumem.data.files import SnapshotFileError
    from jupyter_gpumem.data.schema import LoadLimits

    assert gm.SnapshotFileError is SnapshotFileError and issubclass(SnapshotFileError, ValueError)
    assert gm.LoadLimits is LoadLimits
    with pytest.raises(gm.SnapshotFileError, match="no such file"):
        gm.load_snapshot("/nonexistent/x.json")
