import { describe, expect, it } from 'vitest';
import { endIndex, freeGaps, layoutAt, peakIndex, snapEvent, stops } from '../src/replay';
import { BASE, lives, MiB, SMALL_BASE, TRACE_BLOCKS, TRACE_SEGS } from './helpers';

const L = lives(TRACE_BLOCKS, TRACE_SEGS);

describe('layoutAt', () => {
  it('before the trace: only what was older than it', () => {
    const at = layoutAt(L, -1);
    expect(at.segments.map(s => s.addr)).toEqual([SMALL_BASE]);
    expect(at.segments[0].blocks).toEqual([4]);
    expect(at.nBlocks).toBe(1);
    expect(at.reserved).toBe(2 * MiB);
  });

  it('after each event: exactly the lives with start <= k < end', () => {
    const want: Record<number, number[]> = { 0: [4], 1: [0, 4], 2: [0, 1, 4], 3: [0, 1, 2, 4], 4: [1, 2, 4], 5: [3, 1, 2, 4] };
    for (const [k, blocks] of Object.entries(want)) {
      const at = layoutAt(L, Number(k));
      expect(at.segments.map(s => s.addr)).toEqual([BASE, SMALL_BASE]); // by address
      expect(at.segments.flatMap(s => s.blocks)).toEqual(blocks); // each segment's by address
      expect(at.nBlocks).toBe(blocks.length);
    }
  });

  it('sums allocated and requested bytes of the live blocks', () => {
    const at = layoutAt(L, 3);
    expect(at.allocated).toBe((4 + 2 + 6 + 1) * MiB);
    expect(at.requested).toBe((4 + 1.5 + 6 + 1) * MiB);
    expect(at.reserved).toBe(22 * MiB);
  });

  it('puts a block that lies in no live segment aside', () => {
    const cut = lives([{ start: 0, end: 2, addr: 99 * MiB, size: MiB }], TRACE_SEGS);
    const at = layoutAt(cut, 0);
    expect(at.orphans).toEqual([0]);
    expect(at.nBlocks).toBe(0);
  });
});

describe('freeGaps', () => {
  it('is the segment minus its blocks', () => {
    const at = layoutAt(L, 4); // A freed: [0, 4 MiB) free, B at 4..6, C at 6..12, free to 20
    expect(freeGaps(L, at.segments[0])).toEqual([
      { addr: BASE, size: 4 * MiB },
      { addr: BASE + 12 * MiB, size: 8 * MiB }
    ]);
    expect(freeGaps(L, at.segments[1])).toEqual([{ addr: SMALL_BASE + MiB, size: MiB }]);
    const full = layoutAt(L, 5); // D in the old gap at 0..1
    expect(freeGaps(L, full.segments[0])).toEqual([
      { addr: BASE + MiB, size: 3 * MiB },
      { addr: BASE + 12 * MiB, size: 8 * MiB }
    ]);
  });
});

describe('checkpoints', () => {
  it('every event is a stop when lives are exact', () => {
    expect(stops(L, 6)).toBeNull();
    expect(snapEvent(3.4, 6, null)).toBe(3);
    expect(snapEvent(99, 6, null)).toBe(5);
    expect(snapEvent(-7, 6, null)).toBe(-1);
  });

  it('the slider snaps to the nearest checkpoint, always including -1 and the end', () => {
    const cut = lives(TRACE_BLOCKS, TRACE_SEGS, [3, 1, 99]);
    const st = stops(cut, 6);
    expect(st).toEqual([-1, 1, 3, 5]); // 99 is no event; -1 and the end are always there
    expect(snapEvent(2, 6, st)).toBe(1); // a tie goes to the earlier
    expect(snapEvent(2.6, 6, st)).toBe(3);
    expect(snapEvent(4, 6, st)).toBe(3);
    expect(snapEvent(4.6, 6, st)).toBe(5);
    expect(snapEvent(0, 6, st)).toBe(-1);
  });
});

describe('peak and end', () => {
  it('clamps to -1 .. n-1', () => {
    expect(endIndex(6)).toBe(5);
    expect(endIndex(0)).toBe(-1);
    expect(peakIndex({ index: 3 }, 6)).toBe(3);
    expect(peakIndex({ index: -1 }, 6)).toBe(-1);
    expect(peakIndex({ index: 12 }, 6)).toBe(5);
    expect(peakIndex(null, 6)).toBe(-1);
  });
});
