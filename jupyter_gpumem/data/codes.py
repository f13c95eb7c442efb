"""Codes and sentinels of the trace, one home for every layer.

- ``TraceAction``: the names of the trace actions (the ``action`` of a trace entry).
- ``ACTIONS``: the trace actions in code order; an event's action code is its index here. The
  allocator cores store codes (the C core's ``A_*`` enum in ``csrc/core.h`` mirrors them, and a
  test keeps the two equal); the timeline's ``action`` column uses them too, plus ``OTHER``.
- ``NO_CELL``, ``NO_STACK``, ``NO_SITE``: "unknown" for a cell number, an interned stack id and a
  site id. All are -1, so that ``ids[NO_SITE]`` of a table with one extra last entry maps it.
- ``RELEASE_REASONS``: why a segment went back to the device, the ``reason`` of a segment_free
  trace entry (our addition); a code is its index (the C core's ``R_*`` enum mirrors them).
- ``add_event_details``: what an event's two spare fields (``extra``, ``device_free``) mean
  for its action, as trace-entry keys.
- ``RECORDED_FRAMES`` / ``SHOWN_FRAMES``: how deep a stack is recorded, and how deep it is shown;
  ``SHOWN_OOMS``: how many OOM markers a viewer gets.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

#: What an event of a trace did (PyTorch's names, and our two for expandable segments).
TraceAction = Literal[
    "alloc",  # a block was handed to the user
    "free_requested",  # the user gave a block back
    "free_completed",  # the block is back in the cache and may be reused
    "segment_alloc",  # a segment was obtained from the device
    "segment_free",  # a segment was returned to the device
    "oom",  # a request failed after the whole retry ladder
    "snapshot",  # a snapshot was taken at this point
    "segment_map",  # pages were mapped at the end of an expandable segment (reserved grows)
    "segment_unmap",  # pages of an expandable segment were unmapped (reserved shrinks)
]

#: Every trace action, in the order of their codes (the order of ``TraceAction``).
ACTIONS: tuple[TraceAction, ...] = get_args(TraceAction)
(ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, OOM, SNAPSHOT, SEGMENT_MAP,
 SEGMENT_UNMAP) = range(9)
#: The code of an action this package does not know (only in the timeline's ``action`` column).
OTHER = len(ACTIONS)
#: Action name -> code.
ACTION_CODES: dict[str, int] = {name: code for code, name in enumerate(ACTIONS)}

#: Why a segment was released, in the order of their codes: the user's ``empty_cache()``, the
#: retry ladder's "release every cached segment", its "release cached oversize blocks", and
#: garbage collection. Code 0 (``""``) is "not recorded".
RELEASE_REASONS: tuple[str, ...] = ("", "empty_cache", "retry", "oversize", "gc")
FREED_BY_EMPTY_CACHE, FREED_BY_RETRY, FREED_BY_OVERSIZE, FREED_BY_GC = range(1, 5)

#: Cell number of an event recorded outside any notebook cell (or of unknown cell).
NO_CELL = -1
#: Stack id of an event or block recorded without a stack.
NO_STACK = -1
#: Site id of an allocation with no user frame, or made before the trace began.
NO_SITE = -1
#: How ``NO_SITE`` reads in tables and legends.
NO_SITE_LABEL = "(before the trace, or no stack)"

#: Frames recorded per event, innermost first (the C core's ``MAX_FRAMES`` mirrors it). More
#: frames cost recording time in every malloc; 24 reach past a notebook's few levels of calls.
RECORDED_FRAMES = 24
#: Frames shown per stack (the HTML page's tooltips, the widget's stacks): the innermost ones.
SHOWN_FRAMES = 16
#: OOM markers a viewer (the HTML page, the widget) is sent at most; their count stays exact.
SHOWN_OOMS = 1000
#: What a timeline's bands can be by: allocating site, or holder (``holders.HOLDER_BANDS``).
BANDS = ("site", "holder")


def add_event_details(entry: dict[str, Any], action: int, extra: int, device_free: int) -> None:
    """Put what an event's spare fields mean for its ``action`` into its trace ``entry``: an
    OOM's free device bytes and request; a mapping's virtual address and segment type (the low
    bit of ``extra``); else the block size; a released segment's reason (``device_free`` holds
    its code); zeros mean "not recorded" and add nothing."""
    if action == OOM:
        entry["device_free"] = device_free
        if extra:
            entry["requested_size"] = extra
    elif action in (SEGMENT_MAP, SEGMENT_UNMAP):
        if extra:
            entry["virtual_address"] = extra & ~1
            entry["segment_type"] = "small" if extra & 1 else "large"
    elif extra:
        entry["block_size"] = extra
    if action in (SEGMENT_FREE, SEGMENT_UNMAP) and 0 < device_free < len(RELEASE_REASONS):
        entry["reason"] = RELEASE_REASONS[device_free]
