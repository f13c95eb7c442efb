"""``TraceWidget``: a trace result's view that asks this kernel for the detail its saved data
leaves out (shown by ``trace_view.show_trace``; Note [A view asks the kernel] in ``widget``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jupyter_gpumem.notebook.widget import MemoryWidget

if TYPE_CHECKING:
    from jupyter_gpumem.render.trace_result import TraceResult

__all__ = ["TraceWidget"]


class TraceWidget(MemoryWidget):
    """A trace result's view that asks this kernel for detail; its bundle is the result's."""

    def __init__(self, result: TraceResult, **kwargs: Any) -> None:
        super().__init__(title=result.title, **kwargs)
        self.result = result
        self.show_view(result.to_json(binary=True), result.detail())

    def static_bundle(self) -> dict[str, Any]:
        """The result's own bundle: text, the picture, the view payload."""
        return dict(self.result._repr_mimebundle_())

    def describe(self) -> str:
        return self.result.headline()
