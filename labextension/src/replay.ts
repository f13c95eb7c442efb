// The memory layout after any event, rebuilt from the lives of blocks and segments. No DOM.
import type { Lives } from './payload';

/** A live segment after event k, with the live blocks inside it (by address). */
export interface SegmentAt {
  /** The segment life's index in `lives.segments`. */
  i: number;
  addr: number;
  size: number;
  stream: number;
  small: boolean;
  /** Block life indices in `lives.blocks`, by address. */
  blocks: number[];
}

/**
 * One row of the layout: a classic segment, or an expandable segment's whole virtual range as
 * far as it is known after event k: from the lowest address of its mapped ranges seen so far
 * to the highest end seen so far, its live mapped ranges (`parts`) inside, the rest unmapped.
 */
export interface RowAt {
  expandable: boolean;
  /** The expandable segment's group id, -1 for a classic segment. */
  group: number;
  addr: number;
  /** Bytes the row spans (classic: the segment's size). */
  size: number;
  /** Bytes mapped now (classic: the segment's size). */
  mapped: number;
  /** Virtual bytes the expandable segment reserves (0: unknown, or classic). */
  range: number;
  stream: number;
  small: boolean;
  /** The live segments of the row, by address (one for a classic segment). */
  parts: SegmentAt[];
}

export interface LayoutAt {
  k: number;
  segments: SegmentAt[];
  /** The rows to draw, by address: a classic segment each, an expandable segment each. */
  rows: RowAt[];
  /** Live blocks that lie in no live segment (a cut trace can leave some). */
  orphans: number[];
  /** Allocated blocks in all: the sum of the segments' blocks. */
  nBlocks: number;
  allocated: number;
  requested: number;
  reserved: number;
}

/** Is life i live after event k? (k = -1: before the first event.) */
export function liveAt(start: ArrayLike<number>, end: ArrayLike<number>, i: number, k: number): boolean {
  return start[i] <= k && k < end[i];
}

/** The largest i with sorted[i] <= x, or -1. */
function floorIndex(sorted: ArrayLike<number>, x: number): number {
  let lo = 0;
  let hi = sorted.length - 1;
  let at = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (sorted[mid] <= x) {
      at = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return at;
}

/**
 * The layout after event k: exactly the segments and blocks with start <= k < end, segments
 * by address, each block in the segment that holds its address.
 */
export function layoutAt(lives: Lives, k: number): LayoutAt {
  const S = lives.segments;
  const B = lives.blocks;
  const segments: SegmentAt[] = [];
  for (let i = 0; i < S.n; i++) {
    if (liveAt(S.start, S.end, i, k)) {
      segments.push({
        i,
        addr: S.addr[i],
        size: S.size[i],
        stream: S.stream[i],
        small: S.small[i] !== 0,
        blocks: []
      });
    }
  }
  segments.sort((a, b) => a.addr - b.addr);
  const starts = segments.map(s => s.addr);
  const orphans: number[] = [];
  let nBlocks = 0;
  let allocated = 0;
  let requested = 0;
  for (let i = 0; i < B.n; i++) {
    if (!liveAt(B.start, B.end, i, k)) {
      continue;
    }
    const at = floorIndex(starts, B.addr[i]);
    if (at >= 0 && B.addr[i] < starts[at] + segments[at].size) {
      segments[at].blocks.push(i);
      nBlocks += 1;
      allocated += B.size[i];
      requested += Math.min(B.requested[i], B.size[i]);
    } else {
      orphans.push(i);
    }
  }
  for (const s of segments) {
    s.blocks.sort((x, y) => B.addr[x] - B.addr[y] || x - y);
  }
  const reserved = segments.reduce((t, s) => t + s.size, 0);
  return { k, segments, rows: rowsAt(lives, k, segments), orphans, nBlocks, allocated, requested, reserved };
}

/** The rows after event k of the live `segments` (by address): expandable ones grouped. */
export function rowsAt(lives: Lives, k: number, segments: SegmentAt[]): RowAt[] {
  const S = lives.segments;
  const rows: RowAt[] = [];
  const groups = new Map<number, RowAt>();
  for (const seg of segments) {
    const g = S.expandable[seg.i] ? S.group[seg.i] : -1;
    if (g < 0) {
      rows.push({ expandable: false, group: -1, addr: seg.addr, size: seg.size, mapped: seg.size, range: 0, stream: seg.stream, small: seg.small, parts: [seg] });
      continue;
    }
    let row = groups.get(g);
    if (!row) {
      row = { expandable: true, group: g, addr: seg.addr, size: 0, mapped: 0, range: S.range[seg.i] || 0, stream: seg.stream, small: seg.small, parts: [] };
      groups.set(g, row);
      rows.push(row);
    }
    row.parts.push(seg);
    row.mapped += seg.size;
  }
  if (groups.size > 0) {
    // The span seen so far: every range of the group that began by event k, live or not.
    const lo = new Map<number, number>();
    const hi = new Map<number, number>();
    for (let i = 0; i < S.n; i++) {
      const g = S.group[i];
      if (!S.expandable[i] || !groups.has(g) || S.start[i] > k) {
        continue;
      }
      lo.set(g, Math.min(lo.get(g) ?? Infinity, S.addr[i]));
      hi.set(g, Math.max(hi.get(g) ?? -Infinity, S.addr[i] + S.size[i]));
    }
    for (const [g, row] of groups) {
      row.addr = lo.get(g) ?? row.parts[0].addr;
      row.size = (hi.get(g) ?? row.addr) - row.addr;
    }
  }
  rows.sort((a, b) => a.addr - b.addr);
  return rows;
}

/** The unmapped stretches of a row (none for a classic segment): between its mapped ranges. */
export function unmappedGaps(row: RowAt): Gap[] {
  const gaps: Gap[] = [];
  if (!row.expandable) {
    return gaps;
  }
  let at = row.addr;
  for (const p of row.parts) {
    if (p.addr > at) {
      gaps.push({ addr: at, size: p.addr - at });
    }
    at = Math.max(at, p.addr + p.size);
  }
  if (at < row.addr + row.size) {
    gaps.push({ addr: at, size: row.addr + row.size - at });
  }
  return gaps;
}

/** A stretch of a segment that no live block covers: cached free. */
export interface Gap {
  addr: number;
  size: number;
}

/** The cached free stretches of a live segment (between and after its blocks). */
export function freeGaps(lives: Lives, seg: SegmentAt): Gap[] {
  const B = lives.blocks;
  const gaps: Gap[] = [];
  let at = seg.addr;
  const end = seg.addr + seg.size;
  for (const b of seg.blocks) {
    const a = Math.max(B.addr[b], at);
    if (a > at) {
      gaps.push({ addr: at, size: a - at });
    }
    at = Math.min(Math.max(at, B.addr[b] + B.size[b]), end);
  }
  if (at < end) {
    gaps.push({ addr: at, size: end - at });
  }
  return gaps;
}

/** The events a slider may stop at: every event (-1 .. n-1), or the checkpoints when cut. */
export function stops(lives: Lives, nEvents: number): number[] | null {
  if (lives.checkpoints === null) {
    return null;
  }
  const set = new Set<number>([-1, Math.max(nEvents - 1, -1)]);
  for (const c of lives.checkpoints) {
    if (Number.isInteger(c) && c >= -1 && c < nEvents) {
      set.add(c);
    }
  }
  return [...set].sort((a, b) => a - b);
}

/**
 * The event to show for a wish to see event k: k itself clamped to -1 .. n-1 when the lives
 * are exact everywhere, else the nearest checkpoint (the earlier one on a tie).
 */
export function snapEvent(k: number, nEvents: number, checkpoints: readonly number[] | null): number {
  const top = Math.max(nEvents - 1, -1);
  const c = Math.max(-1, Math.min(top, Math.round(k)));
  if (checkpoints === null || checkpoints.length === 0) {
    return c;
  }
  let best = checkpoints[0];
  for (const p of checkpoints) {
    if (Math.abs(p - c) < Math.abs(best - c)) {
      best = p;
    }
  }
  return Math.max(-1, Math.min(top, best));
}

/** The last event (n-1), or -1 (before the trace) when there are none. */
export function endIndex(nEvents: number): number {
  return Math.max(nEvents - 1, -1);
}

/** The peak's event from the payload, inside -1 .. n-1. */
export function peakIndex(peak: { index: number } | null | undefined, nEvents: number): number {
  const i = peak ? Number(peak.index) : -1;
  return Number.isFinite(i) ? Math.max(-1, Math.min(endIndex(nEvents), Math.trunc(i))) : -1;
}
