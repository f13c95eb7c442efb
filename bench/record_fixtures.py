"""Record the replay fixtures on a GPU: one program, run through our allocator (CuPy) and through
PyTorch's, under each of several allocator configs.

    python bench/record_fixtures.py OUTDIR [--dry-run]

(``--dry-run``: no GPU; our allocator on a simulated device stands in for CuPy, and
``tests/fake_torch.py`` for PyTorch, to check this script and the replay tests.)

The program (``PROGRAM``) allocates arrays of mixed sizes on two streams, frees some, and calls
``empty_cache()`` (once when nothing is cached), under a memory fraction that leaves 2 GiB of
the device: it runs into the retry ladder and caught out-of-memory errors. A free names the
allocation it frees, so the program is the same under every config (an allocation that ran out
of memory is not freed later). The configs (``CONFIGS``): ``max_split_size_mb:64`` (named "",
the files the first fixtures had), the defaults ("default") and ``roundup_power2_divisions:4``
("rp4"); under each, the program's peak reserved bytes, segments or out-of-memory errors differ.
For config NAME (``_NAME`` after the stem, nothing for the first) it writes, each well under
200 KB, with no absolute path (frames' files relative to the project root, or from
``site-packages/`` on):

- ``cupy_trace[_NAME].json.gz``: our snapshot (history without stacks) of the program run with
  CuPy through jupyter_gpumem's allocator; its ``memory_stats()`` are in the snapshot's
  ``jupyter_gpumem`` field;
- ``torch_snapshot[_NAME].pickle``: ``torch.cuda.memory._snapshot()`` (PyTorch's own format) of
  the program run with PyTorch, history recorded with ``stacks="python"``;
- ``torch_snapshot[_NAME].json``: what the replay needs and PyTorch's pickle does not hold:
  ``torch.cuda.memory_stats()`` at the end, the device's total bytes, the memory fraction and
  ``PYTORCH_CUDA_ALLOC_CONF`` at recording time, and where empty_cache() was called (event
  positions, for checking the inference).

Each run is its own process (PyTorch reads ``PYTORCH_CUDA_ALLOC_CONF`` at its first allocation;
ours is installed into CuPy once). A run that fails is reported and the others go on. At the
end it prints each file's size, whether it holds an absolute path, what each allocator counted
under each config, and, as PASS/FAIL lines, whether ``gm.replay`` of the first config's trace
under each other config gives what the allocator counted when the program ran under it, and
whether each trace replays under its own recorded config to its own counts (the other way round,
another config's trace under the first, is printed as INFO). Exit status 1 on any failure.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1 << 20
GiB = 1 << 30
#: (name, PYTORCH_CUDA_ALLOC_CONF) of each config; the first keeps the original file names.
CONFIGS = [("", "max_split_size_mb:64"), ("default", ""), ("rp4", "roundup_power2_divisions:4")]
#: Steps: (MiB, stream index) allocates (allocations are numbered 0, 1, ... in order, made or
#: not); "F<n>" frees allocation n if it was made and is live; "E" calls empty_cache().
PROGRAM: list[Any] = [
    "E",  # nothing cached yet: frees nothing
    (3, 0), (30, 0), (1, 1), (100, 0),  # 0..3
    "F1", (80, 1), "E", "F0", (0.5, 0), "F2",  # 4, 5
    (300, 0), "F3", "E", (150, 1), (700, 0), "F4", "F6",  # 6, 7, 8
    (64, 0), "E", (1200, 0), (900, 0),  # 9, 10 (out of memory), 11
    "F8", (50, 1), "E",  # 12
]
SIZE_LIMIT = 200_000


def fraction_for(total: int, room: int = 2 * GiB) -> float:
    return room / total


def file_names(name: str) -> tuple[str, str, str]:
    """The CuPy trace, PyTorch pickle and its side file of config ``name``."""
    tail = f"_{name}" if name else ""
    return (f"cupy_trace{tail}.json.gz", f"torch_snapshot{tail}.pickle",
            f"torch_snapshot{tail}.json")


def run_program(alloc: Any, free: Any, empty_cache: Any, oom: type[BaseException]
                ) -> tuple[list[int], dict[int, Any]]:
    """Run ``PROGRAM``: ``alloc(nbytes, stream index)`` returns an array; ``free`` drops one.
    Returns the numbers of the allocations that ran out of memory, and the arrays still live
    (keep them until the snapshot is taken)."""
    live: dict[int, Any] = {}
    failed: list[int] = []
    n = 0
    for step in PROGRAM:
        if step == "E":
            empty_cache()
        elif isinstance(step, str):
            array = live.pop(int(step[1:]), None)
            if array is not None:
                free(array)
                del array
        else:
            mib, s = step
            try:
                live[n] = alloc(int(mib * MiB), s)
            except oom:
                failed.append(n)
            n += 1
    return failed, live


# -- no absolute paths ---------------------------------------------------------------------------

def portable(filename: str) -> str:
    """A frame's file with no path of this machine: relative to the project root, else from
    ``site-packages/`` (or ``dist-packages/``) on, else from ``lib/pythonX.Y/`` on, else its
    base name. A relative name ("??", "<frozen ...>", "bench/...") stays."""
    if not filename.startswith("/"):
        return filename
    root = str(ROOT) + "/"
    if filename.startswith(root):
        return filename[len(root):]
    for marker in ("site-packages/", "dist-packages/"):
        i = filename.rfind(marker)
        if i >= 0:
            return filename[i:]
    m = re.search(r"lib/python3[^/]*/", filename)
    if m:
        return filename[m.start():]
    return filename.rsplit("/", 1)[-1]


def _frame_lists(snapshot: dict[str, Any]) -> list[list[dict[str, Any]]]:
    out = []
    for seg in snapshot.get("segments", []):
        out.append(seg.get("frames") or [])
        out.extend(b.get("frames") or [] for b in seg.get("blocks", []))
    for trace in snapshot.get("device_traces", []):
        out.extend(e.get("frames") or [] for e in trace)
    return out


def scrub(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` with every frame's file made ``portable`` (in place; returned)."""
    for frames in _frame_lists(snapshot):
        for f in frames:
            if isinstance(f.get("filename"), str):
                f["filename"] = portable(f["filename"])
    return snapshot


def absolute_paths(data: bytes) -> list[str]:
    """Absolute paths (or the project root) found in a file's bytes, a few of them."""
    text = data.decode("latin-1")
    found = set(re.findall(r"/(?:home|root|usr|opt|tmp|work|var|srv|mnt|Users)/[^\s'\"\x00]{0,60}",
                           text))
    if str(ROOT) in text:
        found.add(str(ROOT))
    return sorted(found)[:5]


# -- the runs (each in its own process) ----------------------------------------------------------

def run_cupy(out: Path, name: str, conf: str) -> None:
    import cupy as cp

    import jupyter_gpumem as gm
    from jupyter_gpumem.data.files import save_snapshot
    from jupyter_gpumem.runtime import registry

    gm.install(config=gm.AllocatorConfig.parse(conf))
    allocator = registry.get_allocator(0)
    total = allocator.device.mem_get_info()[1]
    allocator.set_memory_fraction(fraction_for(total))
    allocator.record_history(stacks=False, max_entries=20_000)
    streams = [cp.cuda.Stream.null, cp.cuda.Stream(non_blocking=True)]

    def alloc(nbytes: int, s: int) -> Any:
        with streams[s]:
            return cp.empty(nbytes, dtype=cp.uint8)

    failed, live = run_program(alloc, lambda a: None, allocator.empty_cache,
                               cp.cuda.memory.OutOfMemoryError)
    cp.cuda.Device().synchronize()
    snapshot = scrub(dict(allocator.snapshot()))
    save_snapshot(snapshot, out / file_names(name)[0])
    print(f"cupy {conf or 'defaults'!r}: out of memory at allocations {failed}, "
          f"{len(live)} arrays live at the end")
    gm.uninstall()


def run_torch(out: Path, name: str, conf: str) -> None:
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") != conf:
        raise RuntimeError(f"PYTORCH_CUDA_ALLOC_CONF is "
                           f"{os.environ.get('PYTORCH_CUDA_ALLOC_CONF')!r}, wanted {conf!r}")
    import torch

    total = torch.cuda.mem_get_info()[1]
    fraction = fraction_for(total)
    torch.cuda.set_per_process_memory_fraction(fraction)
    torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=20_000)
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]
    marks: list[int] = []

    def alloc(nbytes: int, s: int) -> Any:
        with torch.cuda.stream(streams[s]):
            return torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    def empty_cache() -> None:
        marks.append(len(torch.cuda.memory._snapshot()["device_traces"][0]))
        torch.cuda.empty_cache()

    failed, live = run_program(alloc, lambda a: None, empty_cache, torch.OutOfMemoryError)
    torch.cuda.synchronize()
    snap = scrub(torch.cuda.memory._snapshot())
    torch.cuda.memory._record_memory_history(enabled=None)
    _, pickle_name, side_name = file_names(name)
    with open(out / pickle_name, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    meta = {
        "memory_stats": dict(torch.cuda.memory_stats()),
        "device_total": total,
        "per_process_memory_fraction": fraction,
        "PYTORCH_CUDA_ALLOC_CONF": conf,
        "empty_cache_positions": marks,
        "out_of_memory_at": failed,
        "torch": torch.__version__,
    }
    (out / side_name).write_text(json.dumps(meta, indent=1, sort_keys=True))
    print(f"torch {conf or 'defaults'!r}: out of memory at allocations {failed}, "
          f"{len(live)} tensors live at the end")


# -- the dry run: no GPU ---------------------------------------------------------------------------

#: The recorded device's bytes in a dry run (an H200's).
DRY_TOTAL = 150_109_880_320


def pytorch_settings(conf: str) -> dict[str, Any]:
    """``allocator_settings`` as PyTorch 2.11 writes them in a snapshot, for config ``conf``."""
    from jupyter_gpumem.engine.config import AllocatorConfig

    c = AllocatorConfig.parse(conf)
    split = c.max_split_size_mb << 20 if c.max_split_size_mb else (1 << 64) - 1
    div = c.roundup_power2_divisions or 0
    return {"PYTORCH_CUDA_ALLOC_CONF": conf, "max_split_size": split,
            "garbage_collection_threshold": c.garbage_collection_threshold or 0.0,
            "expandable_segments": False,
            "roundup_power2_divisions": {str(1 << i): div for i in range(16)}}


def dry_run(out: Path, name: str, conf: str) -> None:
    """Record config ``name`` with no GPU: "cupy" on our allocator over a simulated device of
    an H200's size, "torch" on ``tests/fake_torch.py`` (PyTorch's format, settings and stats)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import fake_torch

    from jupyter_gpumem import CachingAllocator, SimulatedDevice
    from jupyter_gpumem.data.files import save_snapshot
    from jupyter_gpumem.engine.config import AllocatorConfig
    from jupyter_gpumem.engine.oom import OutOfMemoryError

    config = AllocatorConfig.parse(conf)
    fraction = fraction_for(DRY_TOTAL)
    ours = CachingAllocator(SimulatedDevice(DRY_TOTAL, name="NVIDIA H200"), config)
    ours.set_memory_fraction(fraction)
    ours.record_history(stacks=False, max_entries=20_000)
    run_program(lambda n, s: ours.malloc(n, [0, 7][s]), ours.free, ours.empty_cache,
                OutOfMemoryError)
    save_snapshot(scrub(dict(ours.snapshot())), out / file_names(name)[0])

    fake = fake_torch.FakeTorchMemory(DRY_TOTAL, name="NVIDIA H200")
    fake.allocator.set_config(config)
    fake.allocator.set_memory_fraction(fraction)
    fake._record_memory_history("all", stacks="python", max_entries=20_000)
    marks: list[int] = []

    def empty_cache() -> None:
        marks.append(len(fake._snapshot()["device_traces"][0]))
        fake.empty_cache()

    failed, _live = run_program(lambda n, s: fake.allocator.malloc(n, [0, 7][s]),
                                fake.allocator.free, empty_cache, OutOfMemoryError)
    snap = scrub(fake._snapshot())
    snap["allocator_settings"] = pytorch_settings(conf)
    _, pickle_name, side_name = file_names(name)
    with open(out / pickle_name, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    meta = {"memory_stats": fake.memory_stats(), "device_total": DRY_TOTAL,
            "per_process_memory_fraction": fraction, "PYTORCH_CUDA_ALLOC_CONF": conf,
            "empty_cache_positions": marks, "out_of_memory_at": failed, "torch": "dry run"}
    (out / side_name).write_text(json.dumps(meta, indent=1, sort_keys=True))
    print(f"dry {conf or 'defaults'!r}: out of memory at allocations {failed}")


def run_one(kind: str, name: str, out: Path) -> int:
    conf = dict(CONFIGS)[name]
    (run_cupy if kind == "cupy" else run_torch)(out, name, conf)
    return 0


# -- the report ----------------------------------------------------------------------------------

KEYS = ("peak_reserved", "num_segments", "peak_segments", "num_ooms", "num_alloc_retries")


def counted(stats: dict[str, int]) -> dict[str, int]:
    return {"peak_reserved": stats["reserved_bytes.all.peak"],
            "num_segments": stats["segment.all.current"],
            "peak_segments": stats["segment.all.peak"],
            "num_ooms": stats["num_ooms"], "num_alloc_retries": stats["num_alloc_retries"]}


def replayed(result: Any) -> dict[str, int]:
    return {k: int(getattr(result, k)) for k in KEYS}


def load_run(out: Path, kind: str, name: str) -> tuple[Any, dict[str, int], str, dict[str, Any]]:
    """(snapshot, what the allocator counted, its config, side data) of one recorded run."""
    from jupyter_gpumem.data.files import load_snapshot

    cupy_name, pickle_name, side_name = file_names(name)
    if kind == "cupy":
        snap = load_snapshot(out / cupy_name)
        info = snap["jupyter_gpumem"]
        return snap, counted(info["stats"]), info["config"], {}
    side = json.loads((out / side_name).read_text())
    snap = load_snapshot(out / pickle_name)
    return snap, counted(side["memory_stats"]), side["PYTORCH_CUDA_ALLOC_CONF"], side


def replay_under(kind: str, snap: Any, conf: str, side: dict[str, Any]) -> Any:
    import jupyter_gpumem as gm

    if kind == "cupy":  # our config string carries the fraction
        return gm.replay(snap, conf)
    return gm.replay(snap, conf, capacity=side["device_total"],
                     memory_fraction=side["per_process_memory_fraction"])


def report(out: Path) -> int:
    failures = 0

    def say(ok: bool, text: str) -> None:
        nonlocal failures
        failures += not ok
        print(("PASS " if ok else "FAIL ") + text, flush=True)

    for path in sorted(out.iterdir()):
        try:
            raw = path.read_bytes()
            size = len(raw)
            if path.suffix == ".gz":
                raw = gzip.decompress(raw)
            found = absolute_paths(raw)
            say(size < SIZE_LIMIT and not found,
                f"{path.name}: {size:,} B ({len(raw):,} B unpacked), absolute paths: "
                f"{found or 'none'}")
        except Exception as exc:
            say(False, f"{path.name}: {type(exc).__name__}: {exc}")
    for kind in ("cupy", "torch"):
        runs: dict[str, Any] = {}
        for name, conf in CONFIGS:
            try:
                runs[name] = load_run(out, kind, name)
                print(f"{kind} {conf or 'defaults'!r}: counted {runs[name][1]}")
            except Exception as exc:
                say(False, f"{kind} {conf or 'defaults'!r}: no recording ({type(exc).__name__}: "
                           f"{exc})")
        for name, conf in CONFIGS:  # each trace under its own recorded config
            if name not in runs:
                continue
            snap, count, _conf, side = runs[name]
            try:
                import jupyter_gpumem as gm

                if kind == "cupy":  # ours says its config
                    result = gm.replay(snap)
                else:
                    result = gm.replay(snap, capacity=side["device_total"],
                                       memory_fraction=side["per_process_memory_fraction"])
                say(replayed(result) == count,
                    f"{kind}: replay of {conf or 'defaults'!r} under the config it recorded "
                    f"({result.config}) {replayed(result)} == counted {count}")
            except Exception as exc:
                say(False, f"{kind}: replay of {conf or 'defaults'!r} raised "
                           f"{type(exc).__name__}: {exc}")
        first = CONFIGS[0][0]
        for name, _conf in CONFIGS[1:]:
            # The first config's trace under each other one must give that run's counts. The
            # other way round is shown for information: an allocation that ran out of memory
            # under the other config is in its trace as an error, with no block, so a replay
            # under the first config cannot know it would have been made.
            for src, dst, must in ((first, name, True), (name, first, False)):
                if src not in runs or dst not in runs:
                    continue
                snap, _count, src_conf, side = runs[src]
                _snap, want, dst_conf, _side = runs[dst]
                try:
                    result = replay_under(kind, snap, dst_conf, side)
                    text = (f"{kind}: replay of the {src_conf or 'defaults'!r} trace under "
                            f"{dst_conf or 'defaults'!r}: {replayed(result)} == counted when "
                            f"run under it {want}")
                    if must:
                        say(replayed(result) == want, text)
                    else:
                        print(("INFO (equal) " if replayed(result) == want
                               else "INFO (differs) ") + text)
                except Exception as exc:
                    say(False, f"{kind}: replay {src!r} → {dst!r} raised {type(exc).__name__}: "
                               f"{exc}")
        if len(runs) == len(CONFIGS):
            distinct = {json.dumps(runs[n][1], sort_keys=True) for n, _ in CONFIGS}
            say(len(distinct) == len(CONFIGS),
                f"{kind}: the configs give {len(distinct)} different counts (want "
                f"{len(CONFIGS)})")
    print(f"{failures} failed")
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "--one":  # a child: one run
        return run_one(argv[1], argv[2], Path(argv[3]))
    if len(argv) == 2 and argv[1] == "--dry-run":
        out = Path(argv[0])
        out.mkdir(parents=True, exist_ok=True)
        for name, conf in CONFIGS:
            dry_run(out, name, conf)
        return report(out)
    if len(argv) != 1:
        print(__doc__)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for kind in ("cupy", "torch"):
        for name, conf in CONFIGS:
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if kind == "torch" and conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            try:
                proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one",
                                       kind, name, str(out)], env=env, capture_output=True,
                                      text=True, timeout=300)
                text = (proc.stdout + proc.stderr).strip()
                ok = proc.returncode == 0
            except Exception:
                text, ok = traceback.format_exc(), False
            failed += not ok
            print(("PASS " if ok else "FAIL ") + f"record {kind} {conf or 'defaults'!r}: "
                  + (text.splitlines()[-1] if ok and text else text[-3000:]), flush=True)
    try:
        failed += report(out)
    except Exception:
        failed += 1
        print("FAIL the report raised:\n" + traceback.format_exc())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
