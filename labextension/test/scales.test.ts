import { describe, expect, it } from 'vitest';
import { clampDomain, linearScale, lowerBound, zoomDomain } from '../src/scales';

describe('linearScale', () => {
  it('maps and inverts', () => {
    const s = linearScale([0, 100], [70, 570]);
    expect(s(0)).toBe(70);
    expect(s(50)).toBe(320);
    expect(s.invert(570)).toBe(100);
    const flip = linearScale([0, 10], [200, 0]);
    expect(flip(10)).toBe(0);
    expect(flip.invert(100)).toBe(5);
  });
  it('maps a zero-width domain to the range start', () => {
    const s = linearScale([3, 3], [10, 20]);
    expect(s(3)).toBe(10);
    expect(s.invert(15)).toBe(3);
  });
});

describe('clampDomain', () => {
  it('keeps a window inside the extent by shifting it', () => {
    expect(clampDomain(-10, 20, 0, 100)).toEqual([0, 30]);
    expect(clampDomain(90, 120, 0, 100)).toEqual([70, 100]);
  });
  it('gives the whole extent for a window wider than it', () => {
    expect(clampDomain(-50, 200, 0, 100)).toEqual([0, 100]);
  });
  it('widens a window to the minimum span about its middle', () => {
    expect(clampDomain(50, 50, 0, 100, 10)).toEqual([45, 55]);
    expect(clampDomain(0, 1, 0, 100, 10)).toEqual([0, 10]);
  });
  it('orders reversed bounds', () => {
    expect(clampDomain(30, 10, 0, 100)).toEqual([10, 30]);
  });
});

describe('zoomDomain', () => {
  it('keeps the point under the cursor in place', () => {
    const [lo, hi] = zoomDomain([0, 100], 25, 0.5, [0, 100]);
    expect([lo, hi]).toEqual([12.5, 62.5]);
    const before = linearScale([0, 100], [0, 1000])(25);
    const after = linearScale([lo, hi], [0, 1000])(25);
    expect(after).toBe(before); // 25 stays at a quarter of the width
    expect((25 - lo) / (hi - lo)).toBe(0.25);
  });
  it('zooms out no further than the extent', () => {
    expect(zoomDomain([10, 20], 15, 100, [0, 100])).toEqual([0, 100]);
  });
  it('zooms in no further than the minimum span', () => {
    const [lo, hi] = zoomDomain([0, 100], 50, 0.001, [0, 100], 2);
    expect(hi - lo).toBe(2);
  });
});

describe('lowerBound', () => {
  it('finds the first element not below x', () => {
    const a = [1, 3, 3, 7];
    expect(lowerBound(a, 0)).toBe(0);
    expect(lowerBound(a, 3)).toBe(1);
    expect(lowerBound(a, 4)).toBe(3);
    expect(lowerBound(a, 8)).toBe(4);
  });
});
