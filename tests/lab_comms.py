"""A recording comm layer for the tests of the channel to JupyterLab's panel
(``notebook.lab_channel``): comms as ipykernel's, with the frontend's side to drive."""

from __future__ import annotations

from typing import Any

from jupyter_gpumem.data.lab_schema import COMM_TARGET


class RecordingComm:
    """A comm as ipykernel's: what was sent on it, and how it was closed."""

    def __init__(self, data: Any = None) -> None:
        self.opened_with = data
        self.sent: list[dict[str, Any]] = []
        self.closed_with: Any = None
        self._on_msg: Any = None
        self._on_close: Any = None

    def on_msg(self, callback: Any) -> None:
        self._on_msg = callback

    def on_close(self, callback: Any) -> None:
        self._on_close = callback

    def send(self, data: Any) -> None:
        self.sent.append(data)

    def close(self, data: Any = None) -> None:
        self.closed_with = data

    # the frontend's side
    def frontend_says(self, data: Any) -> None:
        self._on_msg({"content": {"data": data}})

    def frontend_closes(self) -> None:
        self._on_close({"content": {"data": {}}})

    def kinds(self) -> list[str]:
        return [m["type"] for m in self.sent]


class RecordingLayer:
    def __init__(self) -> None:
        self.targets: dict[str, Any] = {}
        self.opened: list[RecordingComm] = []

    def create_comm(self, target_name: str, data: Any) -> RecordingComm:
        assert target_name == COMM_TARGET
        comm = RecordingComm(data)
        self.opened.append(comm)
        return comm

    def register_target(self, target_name: str, callback: Any) -> None:
        self.targets[target_name] = callback

    def unregister_target(self, target_name: str, callback: Any) -> None:
        assert self.targets.pop(target_name) == callback
