"""Every loader against a corpus of hostile and malformed files (see ``hostile_files``).

The API raises one ``SnapshotFileError`` whose text is ``"FILE: reason"`` on one line, for
``load_snapshot`` and ``jupyter_gpumem.replay`` alike. The CLI's ``summary``, ``render`` (a page
and a picture) and ``replay``, run as ``python -m jupyter_gpumem`` under a 1 GiB address-space
limit and a timeout, print that line after ``jupyter-gpumem:`` and exit 1, with no traceback.
``%gpumem load`` and ``%gpumem replay`` in a real InteractiveShell raise a UsageError with that
line. Files that load but were hostile to what reads them next (``later_corpus``) go through
all of these too: each ends in its one-line error or works with bounded output. Odd but valid
files (PyTorch's layouts, shared frames, missing optional keys) load everywhere.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hostile_files import COMMANDS, Case, Later, hostile_corpus, later_corpus, odd_but_valid
from IPython.core.error import UsageError

import jupyter_gpumem
from jupyter_gpumem.data.files import SnapshotFileError, load_snapshot
from jupyter_gpumem.data.schema import MAX_TEXT

ROOT = Path(__file__).resolve().parents[1]
ADDRESS_SPACE = 1 << 30  # RLIMIT_AS of each CLI run
TIMEOUT_S = 120  # a run this long is stuck, not slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    return hostile_corpus(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="module")
def later(tmp_path_factory: pytest.TempPathFactory) -> list[Later]:
    return later_corpus(tmp_path_factory.mktemp("later"))


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return odd_but_valid(tmp_path_factory.mktemp("valid"))


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _run_cli(jobs: list[tuple[str, list[str], dict[str, str]]]
             ) -> dict[str, tuple[int, str, str]]:
    """Run ``python -m jupyter_gpumem ARGS`` for every job, a few at a time (no threads, so
    ``preexec_fn`` is safe); ``{key: (status, stdout, stderr)}``."""
    base = {k: v for k, v in os.environ.items() if k != "JUPYTER_GPUMEM_LOAD_LIMITS"}
    base.update(PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")
    results: dict[str, tuple[int, str, str]] = {}
    running: list[tuple[str, subprocess.Popen[bytes], float, Path]] = []
    pending = list(enumerate(jobs))
    with tempfile.TemporaryDirectory() as tmp:
        while pending or running:
            while pending and len(running) < max(2, os.cpu_count() or 2):
                n, (key, args, env) = pending.pop(0)
                out = Path(tmp, str(n))
                with open(f"{out}.out", "wb") as stdout, open(f"{out}.err", "wb") as stderr:
                    p = subprocess.Popen([sys.executable, "-m", "jupyter_gpumem", *args],
                                         stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                         env={**base, **env}, preexec_fn=_limit_memory, cwd=tmp)
                running.append((key, p, time.monotonic(), out))
            time.sleep(0.02)
            for job in list(running):
                key, p, started, out = job
                if p.poll() is None and time.monotonic() - started < TIMEOUT_S:
                    continue
                if p.returncode is None:
                    p.kill()
                    p.wait()
                results[key] = (p.returncode,
                                Path(f"{out}.out").read_text(errors="replace"),
                                Path(f"{out}.err").read_text(errors="replace"))
                running.remove(job)
    return results


def _problems_of_line(line: str, case: Case, prefix: str = "") -> list[str]:
    problems = []
    if "\n" in line.strip():
        problems.append(f"more than one line: {line!r}")
    if not line.startswith(f"{prefix}{case.path}: "):
        problems.append(f"does not start with {prefix}FILE: : {line[:300]!r}")
    if case.expect not in line:
        problems.append(f"lacks {case.expect!r}: {line[:300]!r}")
    return problems


def test_corpus_is_large_and_varied(corpus: list[Case]) -> None:
    assert len(corpus) >= 90
    assert len({c.name for c in corpus}) == len(corpus)
    sizes = [c.path.stat().st_size for c in corpus if c.path.is_file()]
    assert max(sizes) < 4 << 20  # bombs are small files (2 GiB of zeros gzip to 2 MB)


def _use_env(monkeypatch: pytest.MonkeyPatch, case: Case) -> None:
    """The environment ``case`` is read under (its load limits), and nothing else of ours."""
    monkeypatch.delenv("JUPYTER_GPUMEM_LOAD_LIMITS", raising=False)
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)


def test_api(corpus: list[Case], monkeypatch: pytest.MonkeyPatch) -> None:
    failures = []
    for case in corpus:
        _use_env(monkeypatch, case)
        try:
            load_snapshot(case.path)
        except SnapshotFileError as exc:
            assert isinstance(exc, ValueError)
            assert exc.path == str(case.path)
            failures += [f"{case.name}: {p}" for p in _problems_of_line(str(exc), case)]
        except BaseException as exc:  # what escaped is the failure
            failures.append(f"{case.name}: {type(exc).__name__}: {str(exc)[:200]}")
        else:
            failures.append(f"{case.name}: loaded")
    assert not failures, "\n".join(failures)


def test_api_replay(corpus: list[Case], monkeypatch: pytest.MonkeyPatch) -> None:
    failures = []
    for case in corpus:
        _use_env(monkeypatch, case)
        try:
            jupyter_gpumem.replay(case.path)
        except SnapshotFileError as exc:
            failures += [f"{case.name}: {p}" for p in _problems_of_line(str(exc), case)]
        except BaseException as exc:
            failures.append(f"{case.name}: {type(exc).__name__}: {str(exc)[:200]}")
        else:
            failures.append(f"{case.name}: replayed")
    assert not failures, "\n".join(failures)


#: The CLI's commands: their arguments after the file, given where an output goes.
CLI = {"summary": lambda out: [], "render-html": lambda out: ["-o", f"{out}.html"],
       "render-png": lambda out: ["-o", f"{out}.png"], "replay": lambda out: []}


def _cli_args(command: str, path: Path, out: Path) -> list[str]:
    return [command.split("-")[0], str(path), *CLI[command](out)]


@pytest.mark.parametrize("command", list(CLI))
def test_cli(corpus: list[Case], command: str, tmp_path: Path) -> None:
    results = _run_cli([(c.name, _cli_args(command, c.path, tmp_path / c.name), c.env)
                        for c in corpus])
    failures = []
    for case in corpus:
        status, out, err = results[case.name]
        if status != 1:
            failures.append(f"{case.name}: exit status {status}")
        if "Traceback" in err or out:
            failures.append(f"{case.name}: printed {(out + err)[-400:]!r}")
        failures += [f"{case.name}: {p}" for p in _problems_of_line(err, case, "jupyter-gpumem: ")]
    assert not failures, f"{len(failures)} problem(s):\n" + "\n".join(failures)
    assert not list(tmp_path.iterdir())  # nothing rendered


def test_magic(corpus: list[Case], shell, run, monkeypatch: pytest.MonkeyPatch) -> None:
    result, _ = run("%load_ext jupyter_gpumem")
    assert result.success
    failures = []
    for case in corpus:
        _use_env(monkeypatch, case)
        for magic in ("load", "replay"):
            result, _ = run(f"%gpumem {magic} {case.path}")
            error = result.error_in_exec
            if not isinstance(error, UsageError):
                failures.append(f"{case.name}: {magic}: {type(error).__name__}: "
                                f"{str(error)[:300]}")
            elif magic == "replay" and case.name == "missing.json":  # a typo of last, cupy...
                assert str(error) == (f"replay: no such file '{case.path}' (or last, cupy, "
                                      "torch, jax) (see %gpumem? for usage)")
            else:
                failures += [f"{case.name}: {p}" for p in _problems_of_line(
                    str(error), case, f"%gpumem {magic}: ")]
    assert not failures, f"{len(failures)} problem(s):\n" + "\n".join(failures)


#: The most a command may print or write for a file of ``later_corpus`` (all are small).
OUTPUT_BOUND = 8 << 20


def _later_problem(case: Later, command: str, error: str | None, output: int) -> str | None:
    """What is wrong with what ``command`` did: ``error`` (its one line, or None) against the
    case's expected error, and ``output`` (bytes it printed and wrote) against the bound."""
    expected = case.errors.get(command)
    what = f"{case.name} {command}"
    if expected is None:
        if error is not None:
            return f"{what}: failed: {error[:300]}"
        return f"{what}: {output:,} bytes of output" if output > OUTPUT_BOUND else None
    if error is None:
        return f"{what}: worked, expected {expected!r}"
    if "\n" in error.strip() or expected not in error or f"{case.path}: " not in error:
        return f"{what}: {error[:400]!r} is not one line naming the file with {expected!r}"
    return None


def test_files_that_load_but_were_hostile_later(later: list[Later], shell, run,
                                                tmp_path: Path) -> None:
    assert {c for case in later for c in case.errors} <= set(COMMANDS)
    problems: list[str | None] = []
    for case in later:
        try:
            snap = load_snapshot(case.path)
        except SnapshotFileError as exc:
            problems.append(_later_problem(case, "load", str(exc), 0))
            continue
        problems.append(_later_problem(case, "load", None, 0))
        frames = [f for t in snap["device_traces"] for e in t for f in e["frames"]]
        assert all(len(f["filename"]) <= MAX_TEXT and len(f["name"]) <= MAX_TEXT
                   for f in frames), case.name  # cut at load
        assert len(str(snap.get("jupyter_gpumem", {}).get("device_name", ""))) <= MAX_TEXT
        try:
            jupyter_gpumem.replay(case.path).text()
            problems.append(_later_problem(case, "api-replay", None, 0))
        except ValueError as exc:
            problems.append(_later_problem(case, "api-replay", str(exc), 0))
    jobs = [(f"{case.name} {command}", _cli_args(command, case.path, tmp_path / case.name), {})
            for case in later for command in CLI]
    for key, (status, out, err) in _run_cli(jobs).items():
        name, command = key.split(" ")
        case = next(c for c in later if c.name == name)
        wrote = sum(p.stat().st_size for p in tmp_path.glob(f"{name}.*"))
        if status == 0 and not err:
            problems.append(_later_problem(case, command, None, len(out) + wrote))
        elif status == 1 and err.startswith("jupyter-gpumem: ") and "Traceback" not in err:
            problems.append(_later_problem(case, command, err, len(out) + wrote))
        else:
            problems.append(f"{key}: exit status {status}: {err[-600:]}")
    run("%load_ext jupyter_gpumem")
    for case in later:
        for magic in ("load", "replay"):
            result, captured = run(f"%gpumem {magic} {case.path}")
            error = result.error_in_exec
            if error is not None and not isinstance(error, UsageError):
                problems.append(f"{case.name} %{magic}: {type(error).__name__}: {error}")
                continue
            shown = len(captured.stdout) + sum(len(str(o.data)) for o in captured.outputs)
            problems.append(_later_problem(case, f"%{magic}", error and str(error), shown))
    found = [f"{p}" for p in problems if p is not None]
    assert not found, f"{len(found)} problem(s):\n" + "\n".join(found)


def test_odd_but_valid_files_load_everywhere(valid: list[Path], shell, run,
                                            tmp_path: Path) -> None:
    loaded = {path.name: load_snapshot(path) for path in valid}
    assert loaded.pop("empty_snapshot.json") == {"segments": [], "device_traces": []}
    for name, snap in loaded.items():  # each holds the one segment, at 1 MiB, blocks from there
        assert [s["address"] for s in snap["segments"]] == [1 << 20], name
        assert snap["segments"][0]["blocks"][0]["address"] == 1 << 20, name
    jobs = [(f"s-{p.name}", ["summary", str(p)], {}) for p in valid]
    jobs += [(f"r-{p.name}", ["render", str(p), "-o", str(tmp_path / f"{p.name}.png")], {})
             for p in valid]
    results = _run_cli(jobs)
    for key, (status, _out, err) in results.items():
        assert status == 0, f"{key}: {err[-2000:]}"
    result, _ = run("%load_ext jupyter_gpumem")
    for path in valid:
        result, _ = run(f"view = %gpumem load {path}")
        assert result.success, f"{path.name}: {result.error_in_exec!r}"
