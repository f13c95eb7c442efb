"""The plain data every part of jupyter_gpumem reads: snapshot, segment, block, trace entry.

The key and action names are PyTorch's (``torch.cuda.memory._snapshot``), so a dump of ours opens
in PyTorch's memory viewer and a PyTorch pickle renders with our tools. Our own additions live in
extra keys that PyTorch's readers ignore (``cell``, ``schema``, ``jupyter_gpumem``).
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

#: Version of the snapshot/trace layout written by this package. Bump on any incompatible change.
SCHEMA_VERSION = 1

BlockState = Literal["active_allocated", "active_pending_free", "inactive"]
TraceAction = Literal[
    "alloc",  # a block was handed to the user
    "free_requested",  # the user gave a block back
    "free_completed",  # the block is back in the cache and may be reused
    "segment_alloc",  # a segment was obtained from the device
    "segment_free",  # a segment was returned to the device
    "oom",  # a request failed after the whole retry ladder
    "snapshot",  # a snapshot was taken at this point
]
SegmentType = Literal["small", "large"]


class Frame(TypedDict):
    """One Python stack frame, innermost first in every ``frames`` list."""

    filename: str  # source file of the frame
    line: int  # line number being executed
    name: str  # function name (``<module>`` for a cell's top level)


class BlockInfo(TypedDict):
    """One block of a segment, in address order."""

    address: int  # device address of the block's first byte
    size: int  # bytes the block covers (after rounding and splitting)
    requested_size: int  # bytes the user asked for; 0 for a cached free block
    state: BlockState  # allocated, waiting on a stream, or cached free
    frames: list[Frame]  # where it was allocated (empty without stack recording)


class SegmentInfo(TypedDict):
    """One segment obtained from the device with a single device malloc."""

    device: int  # device index
    address: int  # device address of the segment
    total_size: int  # bytes of the segment
    allocated_size: int  # bytes of its blocks handed to the user
    active_size: int  # allocated plus pending-free bytes
    requested_size: int  # bytes the user asked for, summed over allocated blocks
    stream: int  # stream the segment's blocks belong to
    segment_type: SegmentType  # the pool: "small" (≤ 1 MiB requests) or "large"
    segment_pool_id: tuple[int, int]  # PyTorch's private-pool id; always (0, 0) here
    is_expandable: bool  # PyTorch's expandable segments; always False here
    frames: list[Frame]  # where the segment was allocated
    blocks: list[BlockInfo]  # the segment's blocks, covering it exactly


class TraceEntry(TypedDict):
    """One event of the allocation history."""

    action: TraceAction  # what happened
    addr: int  # block or segment address (0 for an oom)
    size: int  # requested bytes for alloc/free, segment bytes for segment events
    stream: int  # the stream of the block or segment
    time_us: int  # microseconds on the allocator's clock
    frames: list[Frame]  # the user's Python stack at the event, innermost first
    device_free: NotRequired[int]  # for an oom: bytes the device reported free
    block_size: NotRequired[int]  # our addition: bytes of the block, for alloc and free events
    cell: NotRequired[int]  # our addition: the notebook cell running at the event


class Snapshot(TypedDict):
    """The allocator's whole state, plus its recorded history per device."""

    segments: list[SegmentInfo]  # every segment, in address order
    device_traces: list[list[TraceEntry]]  # history, one list per device index
    schema: NotRequired[int]  # our addition: SCHEMA_VERSION of the writer
    jupyter_gpumem: NotRequired[dict[str, object]]  # our addition: stats, config, device info


class CellRecord(TypedDict):
    """One row of the per-cell ledger: what one notebook cell did to the allocator."""

    cell: int  # the cell's execution count
    source: str  # the first line of the cell's source
    allocated_delta: int  # allocated bytes after the cell minus before it
    reserved_delta: int  # reserved bytes after the cell minus before it
    peak_allocated: int  # the highest allocated bytes while the cell ran
    allocs: int  # allocations made by the cell
    frees: int  # frees made by the cell
    segments_new: int  # segments obtained from the device while the cell ran
    ooms: int  # out-of-memory errors raised while the cell ran
    wall_s: float  # wall-clock seconds the cell took
    start_event: int  # index in the trace of the cell's first event (-1 without history)
    end_event: int  # index in the trace just past the cell's last event (-1 without history)
