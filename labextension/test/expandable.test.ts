import { describe, expect, it } from 'vitest';
import { formatBytes, hex } from '../src/format';
import { expandableSummary, layoutGeometry, MIN_ROW_PX, rowLabel, TAIL_PX, unmappedTip } from '../src/layout';
import { layoutAt, unmappedGaps } from '../src/replay';
import { lives, MiB } from './helpers';

const GiB = 1024 * MiB;
const BASE = 0x7e0000000000;
const RANGE = 4.5 * GiB;

/**
 * One expandable large-pool segment on stream 0 (group 0), as data.mapped gives its lives:
 * event 0 maps [0, 20) MiB, event 2 maps [20, 60) (the range merges: a new life), event 4
 * unmaps [20, 40) (two ranges left), event 6 unmaps [40, 60). A classic small segment beside.
 * Blocks: A 10 MiB at +0 (events 1..), B 30 MiB at +22 MiB (events 3..4, freed at 4), C 5 MiB at
 * +45 MiB (events 3..5).
 */
const SEGS = [
  { start: 0, end: 2, addr: BASE, size: 20 * MiB, group: 0, range: RANGE },
  { start: 2, end: 4, addr: BASE, size: 60 * MiB, group: 0, range: RANGE },
  { start: 4, end: 9, addr: BASE, size: 20 * MiB, group: 0, range: RANGE },
  { start: 4, end: 6, addr: BASE + 40 * MiB, size: 20 * MiB, group: 0, range: RANGE },
  { start: -1, end: 9, addr: 0x1000000, size: 2 * MiB, small: true }
];
const BLOCKS = [
  { start: 1, end: 9, addr: BASE, size: 10 * MiB },
  { start: 3, end: 4, addr: BASE + 22 * MiB, size: 18 * MiB },
  { start: 3, end: 6, addr: BASE + 45 * MiB, size: 5 * MiB }
];
const L = lives(BLOCKS, SEGS);

describe('rows of expandable segments', () => {
  it('groups the mapped ranges of one segment into one row spanning what was seen', () => {
    const at = layoutAt(L, 4);
    expect(at.segments).toHaveLength(3); // two mapped ranges + the classic segment
    expect(at.rows).toHaveLength(2);
    const [classic, row] = at.rows;
    expect(classic.expandable).toBe(false);
    expect(row.expandable).toBe(true);
    expect([row.addr, row.size, row.mapped, row.range]).toEqual([BASE, 60 * MiB, 40 * MiB, RANGE]);
    expect(row.parts.map(p => p.addr)).toEqual([BASE, BASE + 40 * MiB]);
    expect(unmappedGaps(row)).toEqual([{ addr: BASE + 20 * MiB, size: 20 * MiB }]);
    expect(at.reserved).toBe(40 * MiB + 2 * MiB); // mapped bytes only
  });

  it('keeps the highest mapped end seen so far after the pages there are unmapped', () => {
    const row = layoutAt(L, 6).rows[1];
    expect([row.size, row.mapped]).toEqual([60 * MiB, 20 * MiB]);
    expect(unmappedGaps(row)).toEqual([{ addr: BASE + 20 * MiB, size: 40 * MiB }]);
    // before the second map, only the first 20 MiB are known
    const early = layoutAt(L, 1).rows[1];
    expect([early.size, early.mapped]).toEqual([20 * MiB, 20 * MiB]);
    expect(unmappedGaps(early)).toEqual([]);
  });

  it('draws the known span to scale and the rest of the reserved range as a tail mark', () => {
    const g = layoutGeometry(L, layoutAt(L, 4), { width: 190 + 600 + 4, labelWidth: 190 });
    const row = g.rows[1];
    const scale = (600 - TAIL_PX) / (60 * MiB);
    expect(row.parts.map(p => [p.x, p.w])).toEqual([
      [190, 20 * MiB * scale],
      [190 + 40 * MiB * scale, 20 * MiB * scale]
    ]);
    expect(row.unmapped.map(u => [u.x, u.w])).toEqual([[190 + 20 * MiB * scale, 20 * MiB * scale]]);
    expect(row.tail).toEqual({ x: 190 + 600 - TAIL_PX, w: TAIL_PX, bytes: RANGE - 60 * MiB });
    expect(row.blocks.map(b => b.i)).toEqual([0, 2]); // B was freed at event 4
    expect(row.blocks[1].x).toBeCloseTo(190 + 45 * MiB * scale);
    // cached free only inside the mapped ranges
    expect(row.gaps.map(x => [x.addr - BASE, x.size])).toEqual([
      [10 * MiB, 10 * MiB],
      [40 * MiB, 5 * MiB],
      [50 * MiB, 10 * MiB]
    ]);
    // a classic row has no unmapped part and no tail; the 2 MiB one is drawn to the same scale
    // as the 60 MiB row (no narrower than MIN_ROW_PX)
    expect(g.rows[0].unmapped).toEqual([]);
    expect(g.rows[0].tail).toBeNull();
    expect(g.rows[0].w).toBe(Math.max(MIN_ROW_PX, 2 * MiB * scale));
    expect(row.w).toBe(600);
  });

  it('says what is mapped of what is reserved, in the label, the summary and the tips', () => {
    const row = layoutAt(L, 4).rows[1];
    expect(rowLabel(row, formatBytes, hex)).toBe(`expandable large s0 · ${formatBytes(40 * MiB)} mapped`);
    expect(rowLabel(layoutAt(L, 4).rows[0], formatBytes, hex)).toBe(`0x1000000 ${formatBytes(2 * MiB)} small s0`);
    expect(expandableSummary(row, formatBytes)).toBe(
      `expandable segment · large pool · stream 0 · ${formatBytes(40 * MiB)} mapped of a ` +
        `${formatBytes(RANGE)} reserved range; drawn up to its highest mapped page (${formatBytes(60 * MiB)})`
    );
    const [head, more] = unmappedTip(row, { addr: BASE + 20 * MiB, size: 20 * MiB }, false, formatBytes, hex);
    expect(head).toBe(`unmapped · ${formatBytes(20 * MiB)} at ${hex(BASE + 20 * MiB)}`);
    expect(more).toContain('no memory behind it');
    expect(unmappedTip(row, { addr: 0, size: RANGE - 60 * MiB }, true, formatBytes, hex)[0]).toContain(
      'the rest of the reserved range (not to scale)'
    );
  });

  it('reads a payload without the expandable columns as all classic', () => {
    const old = lives(BLOCKS, SEGS.map(({ group: _g, range: _r, ...rest }) => rest));
    expect(Array.from(old.segments.group)).toEqual([-1, -1, -1, -1, -1]);
    expect(layoutAt(old, 4).rows).toHaveLength(3);
  });
});
