"""Every time argument outside the Dask package (a live view's interval, its refresh period, the
magic's ``--interval``, the what-if search's budget, the holder search's budget) goes through
``data.units.check_seconds``: NaN, infinities and other non-times are refused with ValueError
(UsageError in the magic) before anything changes. The Dask ones: tests/dask/test_dask_arguments.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from jupyter_gpumem.data.reach import Budget
from jupyter_gpumem.whatif.compare import suggest_config

NOT_TIMES = [math.nan, math.inf, -math.inf, -1, "1", True, None]


@pytest.fixture
def recording_comm(monkeypatch: pytest.MonkeyPatch) -> None:
    comm_package = pytest.importorskip("comm")
    pytest.importorskip("anywidget")
    from tests.notebook.test_widget import RecordingComm

    monkeypatch.setattr(comm_package, "create_comm", lambda **kw: RecordingComm(**kw))


def _sample() -> tuple[int, int, None]:
    return 0, 0, None


@pytest.mark.parametrize("bad", [*NOT_TIMES, 0], ids=repr)
def test_a_live_view_refuses_an_interval_that_is_no_time(recording_comm, bad: object) -> None:
    from jupyter_gpumem.notebook.widget import LiveSession

    with pytest.raises(ValueError, match=r"^interval_s must be a number of seconds in \(0, "):
        LiveSession(_sample, interval_s=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", NOT_TIMES, ids=repr)
def test_a_live_view_refuses_a_refresh_period_that_is_no_time(recording_comm,
                                                               bad: object) -> None:
    from jupyter_gpumem.notebook.widget import LiveSession

    session = LiveSession(_sample, interval_s=0.5)
    with pytest.raises(ValueError, match=r"^every_s must be a number of seconds in \[0, "):
        session.refresh(every_s=bad)  # type: ignore[arg-type]
    assert session._refreshed == 0.0  # nothing changed


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "0", "0.01", "3601", "1e400"])
def test_the_magics_interval_refuses_what_is_no_time(shell: Any, bad: str) -> None:
    from IPython.core.error import UsageError

    shell.run_line_magic("load_ext", "jupyter_gpumem")
    with pytest.raises(UsageError, match="--interval"):
        shell.run_line_magic("gpumem", f"cluster --interval {bad}")


@pytest.mark.parametrize("bad", [b for b in NOT_TIMES if b is not None], ids=repr)
def test_the_what_if_search_refuses_a_budget_that_is_no_time(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^budget_s must be a number of seconds in \[0, "):
        suggest_config("never-read.json", budget_s=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [*NOT_TIMES, 0], ids=repr)
def test_the_holder_search_refuses_a_time_budget_that_is_no_time(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^max_ms must be a number of milliseconds in \(0, "):
        Budget(max_ms=bad)  # type: ignore[arg-type]
