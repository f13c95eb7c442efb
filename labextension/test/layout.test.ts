import { describe, expect, it } from 'vitest';
import { layoutGeometry, MIN_BLOCK_PX, MIN_ROW_PX } from '../src/layout';
import { layoutAt } from '../src/replay';
import { lives, MiB, TRACE_BLOCKS, TRACE_SEGS } from './helpers';

const L = lives(TRACE_BLOCKS, TRACE_SEGS);

describe('layoutGeometry', () => {
  it('draws blocks to scale inside their segment row', () => {
    const g = layoutGeometry(L, layoutAt(L, 3), { width: 400 + 190 + 4, labelWidth: 190 });
    expect(g.labelled).toBe(true);
    expect(g.barX).toBe(190);
    expect(g.barW).toBe(400);
    const [big, small] = g.rows;
    expect(big.y).toBe(0);
    expect(small.y).toBe(17); // 14 px rows, 3 px apart
    expect(g.height).toBe(34);
    // 20 MiB over 400 px: 20 px a MiB
    expect(big.blocks.map(b => [b.i, b.x, b.w, b.reqW])).toEqual([
      [0, 190, 80, 80],
      [1, 270, 40, 30], // 2 MiB block, 1.5 MiB requested: 10 px lost to rounding
      [2, 310, 120, 120]
    ]);
    expect(big.gaps).toEqual([{ addr: 0x1000000 + 12 * MiB, size: 8 * MiB, x: 430, w: 160 }]);
    // rows are to scale: the 2 MiB small segment is a tenth of the 20 MiB one, no narrower
    // than MIN_ROW_PX; its 1 MiB block is half of it
    expect(big.w).toBe(400);
    expect(small.w).toBe(MIN_ROW_PX);
    expect(small.blocks.map(b => [b.x, b.w])).toEqual([[190, MIN_ROW_PX / 2]]);
  });

  it('draws segments of 16 MiB and 92 MiB to scale', () => {
    const segs = [
      { start: 0, end: 1, addr: 0, size: 16 * MiB },
      { start: 0, end: 1, addr: 64 * MiB, size: 92 * MiB }
    ];
    const two = lives([], segs);
    const g = layoutGeometry(two, layoutAt(two, 0), { width: 460 + 190 + 4, labelWidth: 190 });
    expect(g.rows.map(r => r.w)).toEqual([(16 / 92) * 460, 460]);
  });

  it('draws a tiny block at least half a pixel wide', () => {
    const tiny = lives([{ start: 0, end: 1, addr: 0, size: 512 }], [{ start: 0, end: 1, addr: 0, size: 1 << 30 }]);
    const g = layoutGeometry(tiny, layoutAt(tiny, 0), { width: 600 });
    expect(g.rows[0].blocks[0].w).toBe(MIN_BLOCK_PX);
  });

  it('shrinks rows and drops labels when there are many segments', () => {
    const segs = Array.from({ length: 200 }, (_, i) => ({ start: 0, end: 1, addr: i * 2 * MiB, size: 2 * MiB }));
    const g = layoutGeometry(lives([], segs), layoutAt(lives([], segs), 0), { width: 600, maxHeight: 600 });
    expect(g.labelled).toBe(false);
    expect(g.rows).toHaveLength(200);
    expect(g.height).toBeLessThanOrEqual(600);
    expect(g.rows[1].y - g.rows[0].y).toBeGreaterThanOrEqual(g.rows[0].h);
    expect(g.rows[0].h).toBeGreaterThanOrEqual(2);
    expect(g.barX).toBe(8);
  });
});
