import { describe, expect, it } from 'vitest';
import { axisTicks, layoutKeys, rangeTicks, type Tick } from '../src/ticks';

const MiB = 2 ** 20;
const UNIT: Record<string, number> = { B: 1, KiB: 2 ** 10, MiB: 2 ** 20, GiB: 2 ** 30, TiB: 2 ** 40 };

/** The bytes a label names: "0" or a number of at least 1 in a binary unit. */
function labelValue(label: string): number {
  if (label === '0') {
    return 0;
  }
  const m = /^(-?)([0-9.]+) (B|KiB|MiB|GiB|TiB)$/.exec(label);
  expect(m, `label ${label}`).not.toBeNull();
  expect(Number(m![2])).toBeGreaterThanOrEqual(1); // the smaller unit, never "0.5 GiB"
  return (m![1] ? -1 : 1) * Number(m![2]) * UNIT[m![3]];
}

function expectRoundBytes(ticks: Tick[]): void {
  const values = ticks.map(t => t[0]);
  expect(values.length).toBeGreaterThanOrEqual(2);
  const step = values[1] - values[0];
  expect(step).toBeGreaterThanOrEqual(1);
  expect(step).toBe(2 ** Math.round(Math.log2(step)));
  for (const [v, label] of ticks) {
    expect(v % step).toBe(0);
    expect(labelValue(label)).toBe(v);
  }
  values.slice(1).forEach((v, i) => expect(v - values[i]).toBe(step));
}

function expectRoundEvents(values: number[]): void {
  expect(values.length).toBeGreaterThan(0);
  for (const v of values) {
    expect(Number.isInteger(v)).toBe(true);
  }
  if (values.length > 1) {
    const step = values[1] - values[0];
    const mantissa = step / 10 ** Math.floor(Math.log10(step));
    expect([1, 2, 5]).toContain(mantissa);
  }
}

// the same tops the old node tests of viewer.js / widget.js used
const BYTE_TOPS = [1, 700, 3 * MiB, 410 * MiB * 1.1, 451 * MiB, Math.trunc(1.3 * 2 ** 30), 40 * 2 ** 30, Math.trunc(80.5 * 2 ** 30), 3 * 2 ** 40];
const EVENT_TOPS = [0, 1, 2, 3, 8, 9, 99, 769, 123_456];

describe('axisTicks', () => {
  it.each(BYTE_TOPS)('bytes up to %s step by a power of two, exactly labelled', top => {
    const ticks = axisTicks(top, 'bytes');
    const values = ticks.map(t => t[0]);
    expect(values[0]).toBe(0);
    expect(values[values.length - 1]).toBeLessThanOrEqual(top);
    if (top >= 2) {
      expect(values.length).toBeGreaterThanOrEqual(2);
      expect(values.length).toBeLessThanOrEqual(7);
    }
    if (values.length >= 2) {
      expectRoundBytes(ticks);
    }
  });

  it('has no odd mebibyte ticks for a 410 MiB peak', () => {
    expect(axisTicks(451 * MiB, 'bytes').map(t => t[1])).toEqual(['0', '128 MiB', '256 MiB', '384 MiB']);
  });

  it.each(EVENT_TOPS)('events up to %s are whole 1, 2 or 5 x 10^k steps', top => {
    const ticks = axisTicks(top, 'events');
    const values = ticks.map(t => t[0]);
    expect(values[0]).toBe(0);
    expect(values[values.length - 1]).toBeLessThanOrEqual(Math.max(top, 0));
    expect(values.length).toBeLessThanOrEqual(8);
    expectRoundEvents(values);
    expect(ticks.map(t => t[1])).toEqual(values.map(v => (v < 1e4 ? String(v) : v.toLocaleString('en-US'))));
  });

  it('names millions of events by the million, and a close zoom in full', () => {
    expect(axisTicks(10_000_000, 'events').map(t => t[1])).toEqual(['0', '2M', '4M', '6M', '8M', '10M']);
    expect(rangeTicks(4_000_000, 4_400_000, 'events').map(t => t[1])).toEqual(['4M', '4.1M', '4.2M', '4.3M', '4.4M']);
    expect(rangeTicks(4_120_000, 4_125_000, 'events').map(t => t[1])).toEqual(
      ['4,120,000', '4,121,000', '4,122,000', '4,123,000', '4,124,000', '4,125,000']
    );
  });

  it('never puts an event tick between events', () => {
    expect(axisTicks(3, 'events').map(t => t[0])).toEqual([0, 1, 2, 3]);
  });

  it.each([0.3, 2.5, 61, 3600])('seconds up to %s step by 1, 2 or 5 x 10^k with short labels', top => {
    const ticks = axisTicks(top, 'seconds');
    const values = ticks.map(t => t[0]);
    const step = values[1] - values[0];
    const mantissa = Math.round((step / 10 ** Math.floor(Math.log10(step))) * 1e9) / 1e9;
    expect([1, 2, 5]).toContain(mantissa);
    for (const [v, label] of ticks) {
      expect(label.endsWith(' s')).toBe(true);
      expect(Number(label.slice(0, -2))).toBeCloseTo(v, 12);
      expect(label.length).toBeLessThanOrEqual(8); // no 0.30000000000000004
    }
  });
});

describe('rangeTicks (a zoomed window)', () => {
  it('starts at the first multiple of the step inside the window', () => {
    const values = rangeTicks(1234, 1567, 'events', 6).map(t => t[0]);
    expect(values[0]).toBeGreaterThanOrEqual(1234);
    expect(values[values.length - 1]).toBeLessThanOrEqual(1567);
    expectRoundEvents(values);
    expect(values).toEqual([1300, 1400, 1500]); // 333 events / 6 = 55.5: a step of 100
  });
  it('is axisTicks from zero', () => {
    expect(rangeTicks(0, 769, 'events', 6)).toEqual(axisTicks(769, 'events', 6));
  });
});

describe('layoutKeys', () => {
  it('names rounding only when some block lost bytes to it', () => {
    expect(layoutKeys({ allocated: 100, rounding: 0, cached: 50 })).toEqual(['allocated', 'cached']);
    expect(layoutKeys({ allocated: 100, rounding: 7, cached: 0 })).toEqual(['allocated', 'rounding', 'cached']);
    expect(layoutKeys({ allocated: 0, rounding: 0, cached: 0 })).toEqual(['allocated', 'cached']);
  });
});
