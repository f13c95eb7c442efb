"""Expandable segments: page sizes and address-space size, and the note that states the policy.

Note [Expandable segments]
~~~~~~~~~~~~~~~~~~~~~~~~~~
PyTorch's ``expandable_segments:True``, as read in pytorch/pytorch at commit
001074d25084fdb87a799823e395a50f5ec044d3, ``c10/cuda/CUDACachingAllocator.cpp`` (functions named
below) and ``c10/cuda/CUDAAllocatorConfig`` (the key's parser). Both cores implement it; the
C core (``csrc/policy.c``) translates ``pycore`` line by line.

Configuration
- The key is ``expandable_segments``, its values exactly ``True`` or ``False``
  (``parseExpandableSegments``: "Expected a single True/False argument"). PyTorch reads its
  allocator settings once but can change this key at run time
  (``_set_allocator_settings``); so do we: ``set_config`` switches the policy for new
  segments, and segments already made keep their kind. With it off, the free-block search skips
  blocks of expandable segments (``get_free_block``'s "expandable segments has been turned off"
  branch); they are still freed, merged and released as below.
- PyTorch without the driver API warns "expandable_segments not supported on this platform" and
  runs the default policy (``CUDAAllocatorConfig::expandable_segments``). We refuse instead: a
  device without the virtual-memory operations (``VirtualMemoryDevice``: the pluggable C
  allocators) makes ``set_config`` raise ValueError and change nothing, so a user never believes
  a policy is on that is not.

Segments and pages (``ExpandableSegment``, ``find_expandable_block``)
- An expandable segment reserves virtual address space for the whole device, total memory plus
  an eighth, rounded up to whole pages, and maps physical pages into it on demand. Ours: at
  most ``MAX_VIRTUAL_RANGE`` (1 PiB, far above any GPU) before rounding, so that on a simulated
  device near 2**63 B the 63-bit address space still holds a range for each of thousands of
  (stream, pool) pairs; a request above one range is out of memory there, as one larger than
  the whole device is.
- Pages are 2 MiB (``kSmallBuffer``) in the small pool and 20 MiB (``kLargeBuffer``) in the large
  pool; every map and unmap covers whole pages, and the segment's blocks start on its base.
- Segments are per (pool, stream). A miss looks, in address order, at the unmapped blocks of the
  pool and stream; it starts at the free mapped block just before one when there is one, and
  takes the first start from which consecutive free blocks (mapped or not) hold the request.
  Only when none does is a new segment reserved. In practice each (pool, stream) has one
  segment that grows at its end; holes left by unmapping are filled first (lowest address).

Growing (``try_allocate_expandable_block``, ``map_block``)
- The unmapped blocks of that run are mapped in order, each up to what the request still lacks,
  rounded up to pages; a partly used unmapped block keeps its unmapped rest. Each map is one
  device call, one ``segment_map`` trace entry (address, mapped bytes), one
  ``num_device_alloc`` and ``reserved_bytes`` up by the mapped bytes. ``segment.*`` and
  ``oversize_segments`` do not change: an expandable segment is not counted as a segment.
- A failed map is an out-of-memory of that step of the retry ladder: pages mapped by earlier
  steps of the same request stay mapped as cached free blocks (PyTorch returns nullptr and keeps
  them), which the ladder's "release every cached block" then unmaps. Nothing leaks.
- ``per_process_memory_fraction`` is checked as for a classic segment, against the classic
  segment size of the request (``alloc_block``: ``total_allocated_memory + alloc_size``).
- The request is then handed out of the mapped run by the usual split.

Blocks, splits and merges
- A block is mapped or unmapped. Free neighbours merge only when both are mapped or both are
  unmapped (``try_merge_blocks``); an allocated block is always mapped.
- With ``expandable_segments`` on, every split follows the small-pool rule, remainder >= 512 B,
  in both pools and for classic segments too (``should_split``). ``max_split_size`` still makes
  oversize blocks for the free-block search (``get_free_block``) and ``oversize_allocations``.
- Best fit: when the block found is in an expandable segment, the search moves on to the next
  block (same stream, in (size, address) order) while that block's "expandable size" is smaller,
  its size plus the unmapped block right after it (``get_free_block``).
- ``inactive_split`` and ``inactive_split_bytes`` leave blocks of expandable segments out
  (``alloc_found_block``, ``free_block``: "we simply just exclude expandable segments").

Releasing (``release_cached_blocks``, ``release_blocks``, ``unmap_block``,
``release_expandable_segment``)
- ``empty_cache`` and the retry ladder's last step unmap, in every cached free block of an
  expandable segment, the whole pages inside it; the bytes around them stay mapped and free.
  Each unmap is one device call, one ``segment_unmap`` entry, one ``num_device_free``,
  ``reserved_bytes`` down by the unmapped bytes. A segment left with one unmapped block is
  released (its virtual range given back), which changes no counter and records no entry.
- "Release cached oversize blocks" (``release_available_cached_blocks``) and garbage
  collection (``garbage_collect_cached_blocks``) release only unsplit blocks through
  ``release_block``, which asserts the block is not expandable; they skip expandable blocks
  here (an expandable segment's block is split whenever any page is unmapped).

Snapshots and traces (``snapshot``, ``TraceEntry::SEGMENT_MAP/SEGMENT_UNMAP``)
- A snapshot reports each contiguous mapped range of an expandable segment as one segment with
  ``is_expandable`` true, ``total_size`` the sum of its blocks; unmapped ranges do not appear.
- Our own rows (``CachingAllocator.state()``) give one row per expandable segment: ``size`` its
  mapped bytes (so segment sizes still add up to reserved bytes), ``span`` its virtual range and
  only its mapped blocks.

Ours, not PyTorch's
- Note [Device calls come last] holds here too: the blocks of a map or unmap are claimed (out of
  every index, marked in use) before the device call, so a call that re-enters the allocator
  never sees them half-changed; they are settled (merged, indexed) when the call returns.
- Uninstall and teardown: ``empty_cache`` with no live blocks unmaps every page and releases
  every range.
"""

from __future__ import annotations

from jupyter_gpumem.data.sizes import LARGE_BUFFER, MAX_VIRTUAL_RANGE, SMALL_BUFFER

__all__ = ["address_space_size", "page_size"]


def page_size(small: bool) -> int:
    """Bytes of one page of an expandable segment of the small or the large pool."""
    return SMALL_BUFFER if small else LARGE_BUFFER


def address_space_size(total: int, small: bool) -> int:
    """Virtual bytes an expandable segment reserves on a device of ``total`` bytes: total plus
    an eighth, at most ``MAX_VIRTUAL_RANGE``, rounded up to whole pages."""
    page = page_size(small)
    return -(-min(total + total // 8, MAX_VIRTUAL_RANGE) // page) * page
