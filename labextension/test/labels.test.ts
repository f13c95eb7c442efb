import { describe, expect, it } from 'vitest';
import { placeLabel, type Rect, stepMax } from '../src/labels';
import { linearScale } from '../src/scales';

// The timeline's plot box at 860 px wide (PAD l 70, r 14, t 14, b 24; 230 px tall).
const BOX: Rect = { l: 70, r: 846, t: 14, b: 206 };
const W = 24 * 7; // "peak 837 MiB @ event 120"

/** Step curves over events 0..n-1 drawn into BOX; the ceiling placeLabel wants, in px. */
function plot(n: number, ymax: number, ...curves: number[][]) {
  const sx = linearScale([0, n - 1], [BOX.l, BOX.r]);
  const sy = linearScale([0, ymax], [BOX.b, BOX.t]);
  const index = Array.from({ length: n }, (_, i) => i);
  const ceiling = (x0: number, x1: number): number => {
    const top = Math.max(...curves.map(c => stepMax(index, c, n, sx.invert(x0), sx.invert(x1))));
    return top === -Infinity ? Infinity : sy(top);
  };
  return { sx, sy, ceiling };
}

/** Is the label's rect inside the box and clear of the curves and of the mark at (x, y)? */
function readable(rect: Rect, x: number, y: number, ceiling: (a: number, b: number) => number): void {
  expect(rect.l).toBeGreaterThanOrEqual(BOX.l);
  expect(rect.r).toBeLessThanOrEqual(BOX.r);
  expect(rect.t).toBeGreaterThanOrEqual(BOX.t);
  expect(rect.b).toBeLessThanOrEqual(ceiling(rect.l, rect.r));
  const markClear = rect.r <= x - 3.5 || rect.l >= x + 3.5 || rect.b <= y - 3.5;
  expect(markClear).toBe(true);
}

describe('placeLabel', () => {
  it('keeps the peak label off the reserved step that rises just before a peak at the right edge', () => {
    // the browser test's workload: ~180 MiB for 119 events, reserved up to 894 MiB at event
    // 119, the 837 MiB peak at event 120 of 123 (the label used to end on the red riser)
    const n = 123;
    const alloc = Array.from({ length: n }, (_, i) => (i === 120 ? 837 : 150));
    const reserved = Array.from({ length: n }, (_, i) => (i >= 119 ? 894 : 185));
    const { sx, sy, ceiling } = plot(n, 894 * 1.0909, alloc, reserved);
    const x = sx(120);
    const y = sy(837);
    const spot = placeLabel({ x, y, width: W, box: BOX, ceiling });
    expect(spot.clear).toBe(true);
    expect(spot.anchor).toBe('end'); // no room right of the mark
    expect(spot.x).toBe(x - 6);
    readable(spot.rect, x, y, ceiling);
    // above the top of the riser, not beside it
    expect(spot.rect.b).toBeLessThanOrEqual(sy(894) - 3);
  });

  it('sits beside the mark on the roomier side where nothing is in the way', () => {
    const n = 100;
    const alloc = Array.from({ length: n }, (_, i) => (i === 20 ? 800 : 100));
    const { sx, sy, ceiling } = plot(n, 1000, alloc, alloc);
    const x = sx(20);
    const y = sy(800);
    const spot = placeLabel({ x, y, width: W, box: BOX, ceiling });
    // the peak's own step runs on under the label's start: 3 px above it
    expect([spot.anchor, spot.x, spot.rect.b, spot.clear]).toEqual(['start', x + 6, y - 3, true]);
    readable(spot.rect, x, y, ceiling);
    // in the right half: the left side
    const right = placeLabel({ x: sx(80), y, width: W, box: BOX });
    expect([right.anchor, right.x]).toEqual(['end', sx(80) - 6]);
  });

  it('rises over a curve under the label rather than crossing it', () => {
    const n = 100;
    // a reserved plateau at 700 left of a 500 peak at event 70
    const alloc = Array.from({ length: n }, (_, i) => (i === 70 ? 500 : 100));
    const reserved = Array.from({ length: n }, (_, i) => (i >= 50 && i < 69 ? 700 : 520));
    const { sx, sy, ceiling } = plot(n, 1000, alloc, reserved);
    const x = sx(70);
    const y = sy(500);
    const spot = placeLabel({ x, y, width: W, box: BOX, ceiling });
    expect(spot.anchor).toBe('end');
    expect(spot.rect.b).toBe(sy(700) - 3);
    readable(spot.rect, x, y, ceiling);
  });

  it('goes to the other side when the first has no room in the box', () => {
    const n = 100;
    const alloc = Array.from({ length: n }, () => 100);
    const reserved = Array.from({ length: n }, (_, i) => (i < 69 ? 990 : 100));
    const { sx, sy, ceiling } = plot(n, 1000, alloc, reserved);
    // right half, so left first: but left of event 70 the reserved curve fills the box
    const x = sx(70);
    const y = sy(100);
    const spot = placeLabel({ x, y, width: W, box: BOX, ceiling });
    expect([spot.anchor, spot.x, spot.clear]).toEqual(['start', x + 6, true]);
    readable(spot.rect, x, y, ceiling);
  });

  it('centres the label over the mark when neither side is wide enough', () => {
    const box: Rect = { l: 70, r: 306, t: 14, b: 206 };
    const spot = placeLabel({ x: 190, y: 120, width: W, box });
    expect(spot.anchor).toBe('start');
    expect(spot.rect.l).toBe(190 - W / 2);
    expect(spot.rect.b).toBe(120 - 3.5 - 3);
    expect(spot.clear).toBe(true);
    // near the box's edge the centred label slides in
    const edge = placeLabel({ x: 140, y: 120, width: W, box });
    expect([edge.rect.l, edge.rect.r]).toEqual([70, 70 + W]);
  });

  it('falls back to the top of the box when the curves leave no clear spot', () => {
    const n = 10;
    const full = Array.from({ length: n }, () => 1000);
    const { sx, sy, ceiling } = plot(n, 1000, full);
    const spot = placeLabel({ x: sx(8), y: sy(1000), width: W, box: BOX, ceiling });
    expect(spot.clear).toBe(false);
    expect(spot.rect.t).toBe(BOX.t);
    expect(spot.anchor).toBe('end');
  });
});

describe('stepMax', () => {
  const x = [0, 10, 20, 30];
  const y = [1, 5, 2, 9];
  it('takes the values held over the window, risers included', () => {
    expect(stepMax(x, y, 4, 12, 18)).toBe(5); // inside 5's step
    expect(stepMax(x, y, 4, 2, 8)).toBe(1);
    expect(stepMax(x, y, 4, 2, 10)).toBe(5); // the riser at 10 reaches 5
    expect(stepMax(x, y, 4, 21, 29.9)).toBe(2); // the last value shows only at 30
    expect(stepMax(x, y, 4, 21, 30)).toBe(9);
  });
  it('skips gaps and answers -Infinity where nothing is drawn', () => {
    expect(stepMax(x, [1, NaN, 2, 9], 4, 12, 18)).toBe(-Infinity);
    expect(stepMax(x, y, 4, 40, 50)).toBe(-Infinity);
    expect(stepMax([], [], 0, 0, 1)).toBe(-Infinity);
  });
});
