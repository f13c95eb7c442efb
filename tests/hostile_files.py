"""A corpus of hostile and malformed snapshot files, generated small and fast, for every loader.

``hostile_corpus(folder)`` writes the files and returns one ``Case`` per file: what it is, the
path, the text its error must contain, and the limits (``JUPYTER_GPUMEM_LOAD_LIMITS``) to load it
under. ``later_corpus(folder)`` writes files that load but were hostile to what reads them next
(a replay, a picture, a view), one ``Later`` each, with the error each command must end with.
``odd_but_valid(folder)`` writes files that must load: PyTorch's quirks and our own.
Bombs are built from pickle memo references and from gzip members of zeros written one after
another (streamed, never whole in memory), so each file stays under a megabyte.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import pickle
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MiB = 1 << 20
FRAME = {"filename": "train.py", "line": 3, "name": "<module>"}


@dataclass
class Case:
    name: str  # the file's name (also the test id)
    path: Path
    expect: str  # a piece of the one-line error
    env: dict[str, str] = field(default_factory=dict)  # e.g. lowered load limits


def base_snapshot() -> dict[str, Any]:
    """A small valid snapshot in our layout: one segment of two blocks, a two-event trace."""
    return {
        "segments": [{
            "device": 0, "address": MiB, "total_size": 2 * MiB, "allocated_size": 512,
            "active_size": 512, "requested_size": 100, "stream": 0, "segment_type": "small",
            "segment_pool_id": [0, 0], "is_expandable": False, "frames": [],
            "blocks": [
                {"address": MiB, "size": 512, "requested_size": 100,
                 "state": "active_allocated", "frames": [dict(FRAME)]},
                {"address": MiB + 512, "size": 2 * MiB - 512, "requested_size": 0,
                 "state": "inactive", "frames": []}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": MiB, "size": 2 * MiB, "stream": 0,
             "time_us": 1, "frames": [dict(FRAME)]},
            {"action": "alloc", "addr": MiB, "size": 100, "stream": 0, "time_us": 2,
             "frames": [dict(FRAME)]}]],
        "schema": 1,
    }


def _mutated(path: str, value: Any) -> dict[str, Any]:
    """The base snapshot with the field at ``path`` (keys and indices, dot-separated) set to
    ``value``, or deleted when ``value`` is ``_DELETE``."""
    snap = base_snapshot()
    *parents, last = path.split(".")
    node: Any = snap
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    key_: Any = int(last) if isinstance(node, list) else last
    if value is _DELETE:
        del node[key_]
    else:
        node[key_] = value
    return snap


_DELETE = object()


def _shifted(segment_at: int) -> dict[str, Any]:
    """The base snapshot with its segment (and its blocks) moved to ``segment_at``."""
    snap = base_snapshot()
    seg = snap["segments"][0]
    for b in seg["blocks"]:
        b["address"] += segment_at - seg["address"]
    seg["address"] = segment_at
    snap["device_traces"] = []
    return snap


def _cycle() -> dict[str, Any]:
    info: dict[str, Any] = {"device": 0}
    info["stats"] = {"again": info}
    return info


def _nested(depth: int) -> list[Any]:
    node: list[Any] = []
    for _ in range(depth):
        node = [node]
    return node


class _Reduce:
    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.fn, self.args)


def _gzip_members_of_zeros(path: Path, total: int, *, prefix: bytes = b"") -> None:
    """A gzip file that inflates to ``prefix`` then ``total`` zero bytes (or spaces after a
    JSON prefix): one compressed member of 64 MiB, written again and again."""
    fill = b" " if prefix else b"\0"
    member = gzip.compress(fill * (64 * MiB), compresslevel=9)
    with open(path, "wb") as f:
        if prefix:
            f.write(gzip.compress(prefix))
        for _ in range(total // (64 * MiB)):
            f.write(member)


def _memo_bomb_segments() -> bytes:
    """The issue's bomb: 10,000 references to one segment of 10,000 references to one block."""
    block = {"address": 0, "size": 512, "requested_size": 512, "state": "active_allocated",
             "frames": []}
    segment = {"device": 0, "address": 0, "total_size": 512 * 10_000, "stream": 0,
               "segment_type": "large", "frames": [], "blocks": [block] * 10_000}
    return pickle.dumps({"segments": [segment] * 10_000, "device_traces": []}, protocol=4)


def _memo_bomb_events() -> bytes:
    event = {"action": "alloc", "addr": 0, "size": 512, "stream": 0, "time_us": 0, "frames": []}
    trace = [event] * 10_000
    return pickle.dumps({"segments": [], "device_traces": [trace] * 1000}, protocol=4)


def _memo_bomb_frames() -> bytes:
    frames = [{"filename": "/usr/lib/python3/site-packages/x.py", "line": 1, "name": "f"}] * 10_000
    events = [{"action": "alloc", "addr": 512 * i, "size": 512, "stream": 0, "time_us": i,
               "frames": frames} for i in range(10_000)]
    return pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4)


def _shared_text_bomb(both: bool) -> bytes:
    """The issue's file: 1,000 stacks that share one string of 1 MiB as their file name (and as
    their function name too, with ``both``), 9 KB once pickled and gzipped."""
    text = "x" * MiB
    snap = base_snapshot()
    snap["device_traces"][0] = [
        {"action": "alloc", "addr": MiB + 512 * i, "size": 512, "stream": 0, "time_us": i,
         "frames": [{"filename": text, "line": i, "name": text if both else "f"}]}
        for i in range(1000)]
    snap["segments"][0]["blocks"] = [
        {"address": MiB + 512 * i, "size": 512, "requested_size": 512,
         "state": "active_allocated", "frames": []} for i in range(1000)] + [
        {"address": MiB + 512_000, "size": 2 * MiB - 512_000, "requested_size": 0,
         "state": "inactive", "frames": []}]
    return pickle.dumps(snap, protocol=4)


def _json(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _bad_fields() -> list[tuple[str, bytes, str]]:
    """Files whose structure is right but one field is wrong: (name, bytes, expected text)."""
    seg = "segments.0"
    blk = "segments.0.blocks.1"
    ev = "device_traces.0.1"
    cases: list[tuple[str, dict[str, Any] | bytes, str]] = [
        ("negative_size.json", _mutated(f"{blk}.size", -5),
         "segments[0].blocks[1].size: expected a non-negative integer, got -5"),
        ("float_size.json", _mutated(f"{blk}.size", 512.0),
         "segments[0].blocks[1].size: expected a non-negative integer, got 512.0"),
        ("bool_size.json", _mutated(f"{blk}.size", True),
         "segments[0].blocks[1].size: expected a non-negative integer, got True"),
        ("string_size.pickle", _mutated(f"{blk}.size", "512"),
         "segments[0].blocks[1].size: expected a non-negative integer, got '512'"),
        ("missing_size.json", _mutated(f"{blk}.size", _DELETE),
         "segments[0].blocks[1]: missing 'size'"),
        ("negative_total_size.json", _mutated(f"{seg}.total_size", -51_200_000_000),
         "segments[0].total_size: expected a non-negative integer, got -51200000000"),
        ("huge_address.json", _mutated(f"{seg}.address", 1 << 64),
         "segments[0].address: expected a non-negative integer below 2**63"),
        ("huge_int_pickle.pickle", _mutated(f"{seg}.address", 1 << 20_000),
         "segments[0].address: expected a non-negative integer below 2**63, got an integer "
         "of 20001 bits"),
        ("bad_state.json", _mutated(f"{blk}.state", "freed"), "segments[0].blocks[1].state"),
        ("bad_segment_type.json", _mutated(f"{seg}.segment_type", "medium"),
         "segments[0].segment_type: expected 'large' or 'small', got 'medium'"),
        ("blocks_not_list.json", _mutated(f"{seg}.blocks", {"0": 1}),
         "segments[0].blocks: expected a list, got a dict of 1 item(s)"),
        ("blocks_over_total.json", _mutated(f"{blk}.size", 50 << 30),
         "segments[0].blocks: their sizes add up to"),
        ("segment_not_dict.json", _mutated(seg, [1, 2]),
         "segments[0]: expected a dict, got a list of 2 item(s)"),
        ("segments_not_list.json", _mutated("segments", "all"),
         "segments: expected a list, got 'all'"),
        ("segments_a_set.pickle", _mutated("segments", frozenset({1})),
         "segments: expected a list, got a frozenset"),
        ("frames_not_list.json", _mutated(f"{blk}.frames", "train.py:3"),
         "segments[0].blocks[1].frames: expected a list of frames, got 'train.py:3'"),
        ("frame_line_str.json", _mutated("segments.0.blocks.0.frames.0.line", "3"),
         "segments[0].blocks[0].frames[0].line: expected an integer, got '3'"),
        ("frame_no_filename.json", _mutated("segments.0.blocks.0.frames.0.filename", _DELETE),
         "segments[0].blocks[0].frames[0]: missing 'filename'"),
        ("frame_not_dict.json", _mutated("device_traces.0.0.frames.0", "train.py"),
         "device_traces[0][0].frames[0]: expected a dict with filename, line and name"),
        ("traces_not_list.json", _mutated("device_traces", {"0": []}),
         "device_traces: expected a list of lists"),
        ("trace_not_list.json", _mutated("device_traces.0", 7),
         "device_traces[0]: expected a list of trace entries, got 7"),
        ("event_not_dict.json", _mutated(ev, None),
         "device_traces[0][1]: expected a dict, got None"),
        ("event_action_int.json", _mutated(f"{ev}.action", 3),
         "device_traces[0][1].action: expected a string, got 3"),
        ("event_addr_negative.json", _mutated(f"{ev}.addr", -1),
         "device_traces[0][1].addr: expected a non-negative integer, got -1"),
        ("event_size_nan.json", _mutated(f"{ev}.size", float("nan")),
         "device_traces[0][1].size: expected a non-negative integer, got nan"),
        ("event_size_inf.pickle", _mutated(f"{ev}.size", float("inf")),
         "device_traces[0][1].size: expected a non-negative integer, got inf"),
        ("event_cell_huge.json", _mutated(f"{ev}.cell", 1 << 40),
         "device_traces[0][1].cell: expected an integer in [-1, 2147483648)"),
        ("event_time_str.json", _mutated(f"{ev}.time_us", "5"),
         "device_traces[0][1].time_us: expected an integer, got '5'"),
        ("event_no_addr.json", _mutated(f"{ev}.addr", _DELETE),
         "device_traces[0][1]: missing 'addr'"),
        ("info_not_dict.json", _mutated("jupyter_gpumem", [1]),
         "jupyter_gpumem: expected a dict, got a list of 1 item(s)"),
        ("info_device_str.json", _mutated("jupyter_gpumem", {"device": "0"}),
         "jupyter_gpumem.device: expected a non-negative integer, got '0'"),
        ("schema_str.json", _mutated("schema", "1"), "schema: expected an integer, got '1'"),
        ("no_segments.json", {"a": 1}, "not a memory snapshot"),
        ("wrapped_bad.json", {"snapshot": {"segments": 5}}, "segments: expected a list, got 5"),
        ("bare_list_bad.json", b"[1, 2]", "segments[0]: expected a dict, got 1"),
        ("top_string.pickle", pickle.dumps("x" * 100, protocol=2), "not a memory snapshot"),
        # sizes and addresses past what the allocator takes (they raised OverflowError later)
        ("alloc_2_63.json", _mutated(f"{ev}.size", (1 << 63) - 1),
         "device_traces[0][1].size: expected a non-negative integer up to 2**62 (the largest "
         "size the allocator takes), got 9223372036854775807"),
        ("total_size_2_63.pickle", _mutated(f"{seg}.total_size", (1 << 63) - 1),
         "segments[0].total_size: expected a non-negative integer up to 2**62"),
        ("block_size_2_63.json", _mutated(f"{ev}.block_size", (1 << 63) - 1),
         "device_traces[0][1].block_size: expected a non-negative integer up to 2**62"),
        ("requested_2_80.json", _mutated(f"{ev}.requested_size", 1 << 80),
         "device_traces[0][1].requested_size: expected a non-negative integer below 2**63, got "
         "1208925819614629174706176"),
        ("segment_past_2_63.json", _shifted(segment_at=(1 << 63) - MiB),
         "segments[0]: its address 0x7ffffffffff00000 plus its total_size of 2,097,152 bytes "
         "pass 2**63, the end of the address space"),
        ("event_past_2_63.json", _mutated(f"{ev}.addr", (1 << 63) - 50),
         "device_traces[0][1]: its address 0x7fffffffffffffce plus its size of 100 bytes pass "
         "2**63"),
        ("sizes_add_up.json", _mutated("device_traces.0", [  # overflowed the reserved line
            {"action": "segment_alloc", "addr": 0, "size": 1 << 62, "stream": 0, "time_us": i,
             "frames": []} for i in range(3)]),
         "device_traces[0]: the sizes of its events (and of the segments) add up to more than "
         "2**62 bytes"),
        ("block_outside.json", _mutated("segments.0.blocks.0.address", 0),
         "segments[0].blocks[0]: 512 bytes at 0x0 lie outside the segment (0x100000 to "
         "0x300000)"),
        ("block_overlap.json", _mutated("segments.0.blocks.1.address", MiB + 256),
         "segments[0].blocks[1]: 2,096,640 bytes at 0x100100 overlap the block before them"),
        ("event_task_negative.json", _mutated(f"{ev}.task", -1),
         "device_traces[0][1].task: expected an integer in [0, 2147483648), got -1"),
        ("info_device_total_2_80.json", _mutated("jupyter_gpumem", {"device_total": 1 << 80}),
         "jupyter_gpumem.device_total: expected a non-negative integer below 2**63, got "
         "1208925819614629174706176"),
        ("info_device_free_str.json", _mutated("jupyter_gpumem", {"device_free": "lots"}),
         "jupyter_gpumem.device_free: expected a non-negative integer, got 'lots'"),
        # Dask's fields of the wrong type (they raised AttributeError, AssertionError, TypeError)
        ("info_workers_list.json", _mutated("jupyter_gpumem", {"workers": [1]}),
         "jupyter_gpumem.workers: expected a dict keyed by worker address, got a list of 1 "
         "item(s)"),
        ("info_worker_index_str.json", _mutated("jupyter_gpumem", {"workers": {"tcp://a:1": "0"}}),
         "jupyter_gpumem.workers['tcp://a:1']: expected a device index, got '0'"),
        ("info_tasks_dict.json", _mutated("jupyter_gpumem", {"tasks": {"a": 1}}),
         "jupyter_gpumem.tasks: expected a list of task labels, got a dict of 1 item(s)"),
        ("info_tasks_nested.json", _mutated("jupyter_gpumem", {"tasks": [[["x"]]]}),
         "jupyter_gpumem.tasks[0][0]: expected a task key (a string), got a list of 1 item(s)"),
        ("info_task_label_str.json", _mutated("jupyter_gpumem", {"tasks": ["x"]}),
         "jupyter_gpumem.tasks[0]: expected a list of task keys, got 'x'"),
        ("info_missing_workers_int.json",
         _mutated("jupyter_gpumem", {"missing_workers": {"tcp://a:1": 5}}),
         "jupyter_gpumem.missing_workers['tcp://a:1']: expected a string saying what went wrong, "
         "got 5"),
        ("info_devices_list.json", _mutated("jupyter_gpumem", {"devices": {"0": [1]}}),
         "jupyter_gpumem.devices['0']: expected a dict, got a list of 1 item(s)"),
        ("info_devices_total_negative.json",
         _mutated("jupyter_gpumem", {"devices": {"0": {"device_total": -1}}}),
         "jupyter_gpumem.devices['0'].device_total: expected a non-negative integer, got -1"),
        ("info_cycle.pickle", _mutated("jupyter_gpumem", _cycle()),
         "jupyter_gpumem: holds a list or dict that contains itself"),
        ("info_deep.pickle", _mutated("jupyter_gpumem", {"x": _nested(40)}),
         "jupyter_gpumem: nested more than 32 deep"),
    ]
    out = []
    for name, obj, expect in cases:
        if isinstance(obj, bytes):
            data = obj
        elif ".pickle" in name:
            data = pickle.dumps(obj, protocol=4)
        else:
            data = _json(obj)
        out.append((name, data, expect))
    return out


def hostile_corpus(folder: Path) -> list[Case]:
    """Write every hostile file under ``folder``; one Case each."""
    folder.mkdir(parents=True, exist_ok=True)
    cases: list[Case] = []

    def add(name: str, data: bytes | None, expect: str, **env: str) -> None:
        path = folder / name
        if data is not None:
            path.write_bytes(data)
        cases.append(Case(name, path, expect, {"JUPYTER_GPUMEM_LOAD_LIMITS": ",".join(
            f"{k}:{v}" for k, v in env.items())} if env else {}))

    good = _json(base_snapshot())
    good_pickle = pickle.dumps(base_snapshot(), protocol=4)
    # not a file
    add("empty.json", b"", "empty file")
    add("spaces.json", b"  \n\t ", "holds only whitespace")
    (folder / "adir.json").mkdir(exist_ok=True)
    add("adir.json", None, "is a directory")
    add("missing.json", None, "no such file")
    os.mkfifo(folder / "fifo.pickle")
    add("fifo.pickle", None, "not a regular file")
    # random bytes, fixed seed
    rng = random.Random(1234)
    for i, ext in enumerate((".json", ".json.gz", ".pickle", ".pkl.gz", ".bin", ".pt", ".json",
                             ".pickle", ".pkl", ".json")):
        add(f"random_{i}{ext}", rng.randbytes(rng.randrange(1, 4096)), "")
    for i in range(4):  # a pickle header then noise: the unpickler itself must say no
        add(f"random_proto{i}.pickle", bytes([0x80, 2 + i % 3]) + rng.randbytes(2000), "")
    # corrupt pickles
    add("proto6.pickle", b"\x80\x06" + good_pickle[2:], "unsupported pickle protocol: 6")
    add("proto9.json", b"\x80\x09}.", "unsupported pickle protocol: 9")
    add("invalid_load_key.pickle", b"\x80\x04\xff", "invalid load key")
    add("truncated.pickle", good_pickle[: len(good_pickle) // 2], "not a valid pickle")
    add("stack_underflow.pickle", b"\x80\x02.", "unpickling stack underflow")
    add("memo_missing.pickle", b"\x80\x02h\x07.", "not a valid pickle")
    add("unhashable_key.pickle", b"\x80\x02}]]s.", "unhashable")
    add("binbytes8_huge.pickle", b"\x80\x04\x8e" + (1 << 40).to_bytes(8, "little") + b".", "")
    add("binunicode8_huge.pickle", b"\x80\x04\x8d" + (1 << 40).to_bytes(8, "little") + b".",
        "not a valid pickle")
    add("bad_utf8.pickle", b"\x80\x02X\x02\x00\x00\x00\xff\xfe.", "not a valid pickle")
    add("deep_nesting.pickle", b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b".",
        "segments[0]: expected a dict")
    # code in pickles
    add("os_system.pickle", pickle.dumps(
        {"segments": [], "x": _Reduce(os.system, ("echo PWNED",))}, protocol=2),
        "refusing to load")
    add("thread_class.pkl.gz", gzip.compress(pickle.dumps(threading.Thread, protocol=4)),
        "refusing to load threading.Thread")
    add("eval.pickle", pickle.dumps(_Reduce(eval, ("1",)), protocol=4), "builtins.eval")
    add("codecs_rot13.pickle", pickle.dumps(_Reduce(
        __import__("_codecs").encode, ("x", "rot13")), protocol=2), "_codecs.encode")
    add("persistent_id.pickle", b"\x80\x02X\x01\x00\x00\x00aQ.", "persistent ids")
    add("proto0_system.pkl", b"cos\nsystem\n(S'echo PWNED'\ntR.", "refusing to load os.system")
    # corrupt gzip
    gz = gzip.compress(good)
    add("truncated.json.gz", gz[: len(gz) // 2], "truncated gzip data")
    add("bad_crc.json.gz", gz[:-8] + bytes(8), "corrupt gzip data")
    body = bytearray(gz)
    body[20:40] = bytes(20)
    add("corrupt_body.json.gz", bytes(body), "")
    add("not_gzip.json.gz", b"hello world", "not gzip data though its name ends in .gz")
    add("gzip_trailing_junk.json.gz", gz + b"junk!", "corrupt gzip data")
    # bombs
    _gzip_members_of_zeros(folder / "zeros_2GiB.json.gz", 2 << 30)
    add("zeros_2GiB.json.gz", None, "gzip data that holds neither JSON nor a pickle")
    (folder / "zeros_2GiB.pickle.gz").write_bytes((folder / "zeros_2GiB.json.gz").read_bytes())
    add("zeros_2GiB.pickle.gz", None, "gzip data that holds neither JSON nor a pickle")
    _gzip_members_of_zeros(folder / "spaces_128MiB.json.gz", 128 * MiB,
                           prefix=b'{"segments": [')
    add("spaces_128MiB.json.gz", None, "more than 64.0 MiB once decompressed (limit max_bytes",
        max_bytes="64MiB")
    add("memo_segments.pickle", _memo_bomb_segments(),
        "holds more than 4,000,000 blocks (limit max_blocks)")
    add("memo_events.pickle", _memo_bomb_events(),
        "holds more than 1,000,000 trace events (limit max_events)",
        max_events="1000000")
    add("memo_frames.pickle", _memo_bomb_frames(),
        "holds more than 50,000,000 stack frame references")
    many = base_snapshot()
    many["segments"] = [copy.deepcopy(many["segments"][0]) for _ in range(11)]
    add("eleven_segments.json", _json(many), "holds more than 10 segments (limit "
        "max_segments); raise it with JUPYTER_GPUMEM_LOAD_LIMITS=max_segments:N",
        max_segments="10")
    add("devices_bomb.pickle", pickle.dumps(
        {"segments": [], "device_traces": [[]] * 100_000}, protocol=4),
        "holds more than 1,024 per-device trace lists (limit max_devices)")
    add("shared_text.pickle.gz", gzip.compress(_shared_text_bomb(both=True)),
        "holds more than 1,073,741,824 characters of text (a string shared by several stack "
        "frames or places counts at each) (limit max_bytes)")
    add("info_memo_bomb.pickle", pickle.dumps(_mutated("jupyter_gpumem", {
        "tasks": [["k"] * 10_000] * 10_000}), protocol=4),
        "holds more than 10,000,000 items in the jupyter_gpumem dict (a list or dict used in "
        "several places counts at each) (limit max_extras)")
    add("info_text_bomb.pickle", pickle.dumps(_mutated("jupyter_gpumem", {
        "device_name": "x", "notes": ["y" * MiB] * 2000}), protocol=4),
        "holds more than 1,073,741,824 characters of text")
    # malformed JSON
    add("deep_nesting.json", b"[" * 100_000 + b"]" * 100_000, "nested too deeply")
    add("top_number.json", b"42", "neither JSON nor a pickle")
    add("trailing_garbage.json", good + b" xx", "not valid JSON: Extra data")
    add("truncated.json", good[: len(good) // 2], "not valid JSON")
    add("bad_utf8.json", b'{"segments": "\xff\xfe"}', "not UTF-8")
    add("huge_digits.json", b'{"segments": [], "schema": ' + b"1" * 5000 + b"}",
        "not valid JSON")
    add("nan_everywhere.json", b'{"segments": NaN}', "segments: expected a list, got nan")
    for name, data, expect in _bad_fields():
        add(name, data, expect)
    return cases


def odd_but_valid(folder: Path) -> list[Path]:
    """Files that must load: PyTorch's layouts (shared frames, missing optional keys,
    protocol 2, gzipped, a bare list), a saved TraceResult, extra keys, unknown actions."""
    folder.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []

    def add(name: str, data: bytes) -> None:
        (folder / name).write_bytes(data)
        out.append(folder / name)

    torch_like = base_snapshot()
    shared = [dict(FRAME), {"filename": "??", "line": 0, "name": "c10::alloc", "extra": 1}]
    for b in torch_like["segments"][0]["blocks"]:
        del b["address"]
        b["frames"] = shared
    for e in torch_like["device_traces"][0]:
        del e["time_us"]
        e["frames"] = shared
        e["compile_context"] = "N/A"
    del torch_like["segments"][0]["device"], torch_like["schema"]
    torch_like["device_traces"][0].append({"action": "segment_map", "addr": MiB, "size": 0,
                                           "stream": 0, "frames": shared})
    add("torch_like.pickle", pickle.dumps(torch_like, protocol=2))
    add("torch_like.pkl.gz", gzip.compress(pickle.dumps(torch_like, protocol=4)))
    add("bare_list.pickle", pickle.dumps(base_snapshot()["segments"], protocol=4))
    add("wrapped.json", _json({"snapshot": base_snapshot(), "cell": 3}))
    weird = base_snapshot()
    weird["jupyter_gpumem"] = {"stats": {"num_ooms": "many"}, "device_name": 5}
    weird["device_traces"][0].append({"action": "mystery", "addr": 0, "size": 0,
                                      "frames": []})
    add("weird_extras.json", _json(weird))
    add("bom.json", b"\xef\xbb\xbf" + _json(base_snapshot()))
    add("plain_named.json.gz", _json(base_snapshot()))  # not gzipped, though named so
    add("empty_snapshot.json", _json({"segments": [], "device_traces": []}))
    add("gzipped.json.gz", gzip.compress(_json(base_snapshot())))
    return out


@dataclass
class Later:
    """A file that loads and was hostile to what reads it next. ``errors``: a piece of the
    one-line error each command must end with, by command (``COMMANDS``); every other command
    must work, with bounded output."""

    name: str
    path: Path
    errors: dict[str, str] = field(default_factory=dict)


#: What ``Later`` files go through: the loader, the CLI's commands, ``jupyter_gpumem.replay``
#: and the magics that read a file.
COMMANDS = ("load", "summary", "render-html", "render-png", "replay", "api-replay", "%load",
            "%replay")
_REPLAYS = ("replay", "api-replay", "%replay")


def later_corpus(folder: Path) -> list[Later]:
    """Write the files that load but used to hang, overflow or raise a traceback later."""
    folder.mkdir(parents=True, exist_ok=True)
    cases: list[Later] = []

    def add(name: str, data: bytes, errors: dict[str, str] | None = None) -> None:
        (folder / name).write_bytes(data)
        cases.append(Later(name, folder / name, errors or {}))

    def replay_error(text: str) -> dict[str, str]:
        return dict.fromkeys(_REPLAYS, text)

    # 9 KB that stood for 1 GB of stack text: 2.1 GB of HTML and a minute of %gpumem load
    add("shared_filename.pickle.gz", gzip.compress(_shared_text_bomb(both=False)))
    big_name = base_snapshot()
    big_name["jupyter_gpumem"] = {"device_name": "x" * 10_000_000}  # minutes to draw
    add("device_name_10MB.json.gz", gzip.compress(_json(big_name)))
    odd = base_snapshot()  # lone surrogates: no output encodes them
    odd["jupyter_gpumem"] = {"device_name": "GPU \ud800"}
    odd["device_traces"][0][1]["frames"] = [{"filename": "tra\udc80in.py", "line": 3,
                                             "name": "\ud800"}]
    add("lone_surrogates.json", _json(odd))
    segments_only = {"segments": [], "device_traces": [[  # matplotlib's TypeError
        {"action": "segment_alloc", "addr": MiB, "size": 2 * MiB, "stream": 0, "time_us": 1,
         "frames": []},
        {"action": "segment_free", "addr": MiB, "size": 2 * MiB, "stream": 0, "time_us": 2,
         "frames": []}]]}
    add("segment_events_only.json", _json(segments_only))
    no_segment = {"segments": [], "device_traces": [[
        {"action": action, "addr": 0x1000, "size": 512, "stream": 0, "time_us": t, "frames": []}
        for t, action in enumerate(("alloc", "free_requested", "free_completed"))]]}
    add("alloc_free_no_segments.json", _json(no_segment), {"%load": (
        "device_traces[0][2]: block 0x1000 lies in no segment (the trace and the snapshot "
        "disagree)")})
    small = base_snapshot()  # a small-pool segment the policy never makes, older than the trace
    small["segments"][0]["total_size"] = 3 * MiB
    small["segments"][0]["blocks"][1]["size"] = 3 * MiB - 512
    small["device_traces"][0] = small["device_traces"][0][1:]
    add("small_pool_3MiB.json", _json(small), replay_error(
        "segments[0].total_size: a small-pool segment of 3,145,728 bytes, which the policy never "
        "makes (only 2,097,152): the replay cannot rebuild it"))
    no_room = {"segments": [], "device_traces": [[
        {"action": "oom", "addr": 0, "size": 512, "stream": 0, "time_us": 1, "frames": [],
         "device_free": 0}]]}
    add("no_room_to_replay.json", _json(no_room), replay_error(
        "device_traces[0][0].device_free: the allocator could use 0 bytes of the device"))
    bad_config = base_snapshot()
    bad_config["jupyter_gpumem"] = {"config": "\0"}
    add("bad_config.json", _json(bad_config), replay_error(
        "jupyter_gpumem.config: expected key:value, got '\\x00'"))
    return cases
