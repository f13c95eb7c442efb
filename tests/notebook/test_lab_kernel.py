"""The channel to JupyterLab's panel on a real ipykernel (Note [Messages from a thread] in
``notebook.lab_channel``): the comm the load opens, the answer to a hello, the samples the
sampler thread pushes while a cell still runs, the cell's message with the request's ids, a
comm a frontend opens, and the unload.

A jupyter_client plays the browser: it reads IOPub and sends on the shell channel, as
JupyterLab does.
"""

from __future__ import annotations

import os
import queue
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpumem.data.lab_schema import COMM_TARGET

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


@pytest.fixture(scope="module")
def kernel() -> Iterator[Any]:
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def execute(kc: Any, code: str, cell_id: str | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Run ``code`` as JupyterLab would (the cell's id in the request's metadata); the request's
    msg_id and every IOPub message of it up to its idle status, each with the time it came."""
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": True}
    msg = kc.session.msg("execute_request", content,
                         metadata={"cellId": cell_id} if cell_id else {})
    kc.shell_channel.send(msg)
    return msg["header"]["msg_id"], until_idle(kc, msg["header"]["msg_id"])


def until_idle(kc: Any, msg_id: str, timeout: float = 60) -> list[dict[str, Any]]:
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        m["received"] = time.monotonic()
        got.append(m)
        if (m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
                and m["parent_header"].get("msg_id") == msg_id):
            return got
    raise AssertionError(f"no idle status within {timeout} s; got {[m['msg_type'] for m in got]}")


def comm_data(msgs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in msgs if m["msg_type"] == "comm_msg"
            and m["content"]["data"].get("type") == kind]


def send_on_comm(kc: Any, msg_type: str, content: dict[str, Any]) -> str:
    msg = kc.session.msg(msg_type, content)
    kc.shell_channel.send(msg)
    return str(msg["header"]["msg_id"])


def next_comm_msgs(kc: Any, comm_id: str, timeout: float = 10) -> list[dict[str, Any]]:
    """IOPub comm messages on ``comm_id`` until one arrives and the kernel is idle again."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            if got:
                return got
            continue
        if m["msg_type"].startswith("comm_") and m["content"].get("comm_id") == comm_id:
            got.append(m)
    return got


def test_the_channel_on_a_real_kernel(kernel: Any) -> None:
    kc = kernel
    # the load opens a comm to the frontends, its data the state
    _, msgs = execute(kc, "%load_ext jupyter_gpumem\n%gpumem device sim")
    opened = [m for m in msgs if m["msg_type"] == "comm_open"
              and m["content"]["target_name"] == COMM_TARGET]
    assert len(opened) == 1
    announced = opened[0]["content"]
    assert announced["data"]["type"] == "state" and announced["data"]["version"] == 1
    comm_id = announced["comm_id"]

    # a frontend that attaches to it says hello, and gets the state on it
    send_on_comm(kc, "comm_msg", {"comm_id": comm_id, "data": {"type": "hello"}})
    reply = next_comm_msgs(kc, comm_id)
    assert [m["content"]["data"]["type"] for m in reply] == ["state"]

    # a cell of 1.5 s: samples come while it runs, then its message with the request's ids
    cell_id = f"cell-{uuid.uuid4().hex[:6]}"
    code = ("import time, jupyter_gpumem as gm\nx = gm.caching_allocator_alloc(64 << 20)\n"
            "time.sleep(1.5)")
    msg_id, msgs = execute(kc, code, cell_id)
    kinds = [(m["msg_type"], m["content"].get("data", {}).get("type")) for m in msgs]
    samples = comm_data(msgs, "samples")
    cells = comm_data(msgs, "cell")
    assert len(cells) == 1, kinds
    assert 1 <= len(samples) <= 5, kinds  # at most two a second
    cell = cells[0]
    # pushed while the cell ran: well before its end, from the sampler thread
    assert cell["received"] - samples[0]["received"] >= 0.5
    assert samples[0]["parent_header"].get("msg_id") == msg_id
    rows = [r for m in samples for r in m["content"]["data"]["lanes"]["cupy:0"]]
    assert any(r[1] == 64 * MiB for r in rows)  # x, allocated before the sleep
    data = cell["content"]["data"]
    assert data["cell_id"] == cell_id and data["msg_id"] == msg_id
    record = data["badge"]["records"][0]
    assert record["allocated_delta"] == record["peak_allocated"] == 64 * MiB
    assert record["holders"] == "x (64.0 MiB)"
    assert data["span"]["end"] - data["span"]["start"] >= 1.5
    assert msgs.index(cell) < len(msgs) - 1  # before the idle status

    # a frontend that opens a comm of its own gets the state on it
    own = uuid.uuid4().hex
    send_on_comm(kc, "comm_open", {"comm_id": own, "target_name": COMM_TARGET,
                                   "data": {"type": "hello"}})
    got = next_comm_msgs(kc, own)
    assert got and got[0]["content"]["data"]["type"] == "state"
    state = got[0]["content"]["data"]
    assert [c["cell_id"] for c in state["cells"]] == [cell_id]
    assert state["lanes"][0]["key"] == "cupy:0" and state["devices"][0]["total"] == 80 << 30

    # the unload closes both, saying why
    _, msgs = execute(kc, "%unload_ext jupyter_gpumem")
    closed = {m["content"]["comm_id"]: m["content"]["data"] for m in msgs
              if m["msg_type"] == "comm_close"}
    assert closed == {comm_id: {"reason": "unload"}, own: {"reason": "unload"}}
