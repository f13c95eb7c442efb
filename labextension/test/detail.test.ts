import { describe, expect, it } from 'vitest';
import {
  coarseNote,
  decodeWindow,
  joinBuffers,
  layoutNote,
  LivesCache,
  SeriesCache,
  tooCoarse,
  windowToAsk
} from '../src/detail';
import { decodePayload, decodeTimeline, type DecodedTimeline } from '../src/payload';
import { columnAt } from '../src/pick';
import { linearScale } from '../src/scales';
import { stepArea, stepPath } from '../src/views/paths';
import { col, lives, livesPayload, TRACE_BLOCKS, TRACE_SEGS, tracePayload } from './helpers';

/** A series of `n` columns of `per` events each from event `i0`. */
function series(i0: number, n: number, per: number): DecodedTimeline {
  const index = Array.from({ length: n }, (_, c) => i0 + c * per);
  const zeros = index.map(() => 0);
  return decodeTimeline(
    {
      index: col('i4', index),
      time_us: col('f8', zeros),
      allocated: col('f8', zeros),
      reserved: col('f8', zeros),
      allocated_min: col('f8', zeros),
      reserved_min: col('f8', zeros),
      peak_at: col('i4', index),
      bands: [],
      band_labels: [],
      band_sites: [],
      window: [i0, i0 + n * per],
      per_column: per
    },
    10_000_000
  );
}

describe('decodeTimeline', () => {
  it('reads the level-of-detail columns: min, max, peak_at, the window', () => {
    const t = decodeTimeline(
      {
        index: col('i4', [100, 110, 120]),
        time_us: col('f8', [1, 2, 3]),
        allocated: col('f8', [5, 9, 7]),
        reserved: col('f8', [10, 10, 12]),
        allocated_min: col('f8', [1, 2, 3]),
        reserved_min: col('f8', [8, 10, 10]),
        peak_at: col('i4', [104, 117, 120]),
        bands: [col('f8', [5, 9, 7])],
        band_labels: ['x'],
        band_sites: [0],
        window: [100, 125],
        per_column: 10
      },
      1000
    );
    expect(t.n).toBe(3);
    expect(Array.from(t.allocatedMin)).toEqual([1, 2, 3]);
    expect(Array.from(t.peakAt)).toEqual([104, 117, 120]);
    expect(t.window).toEqual([100, 125]);
    expect(t.perColumn).toBe(10);
  });

  it('reads an older payload as exact points: min = max, peak_at = index', () => {
    const v = decodePayload(tracePayload());
    const t = v.timeline;
    expect(Array.from(t.allocatedMin)).toEqual(Array.from(t.allocated));
    expect(Array.from(t.peakAt)).toEqual(Array.from(t.index));
    expect(t.window).toEqual([0, 6]);
    expect(t.perColumn).toBe(1); // every event kept
    expect(v.lives.stacks).toEqual(tracePayload().stacks); // the payload's names
    expect(v.lives.exact).toBeNull();
  });

  it('refuses a level-of-detail column of another length', () => {
    const bad = { ...tracePayload().timeline, allocated_min: col('f8', [1, 2]) };
    expect(() => decodeTimeline(bad, 6)).toThrow(/timeline column has 2 points/);
  });
});

describe('joinBuffers and decodeWindow', () => {
  it('puts each buffer back into its column and decodes the answer', () => {
    const payload = livesPayload(TRACE_BLOCKS, TRACE_SEGS);
    const buffers: DataView[] = [];
    const split = (value: unknown): unknown => {
      if (Array.isArray(value)) {
        return value.map(split);
      }
      if (value && typeof value === 'object') {
        const o = value as Record<string, unknown>;
        if ('dtype' in o && 'data' in o) {
          buffers.push(o.data as DataView);
          return { dtype: o.dtype, buffer: buffers.length - 1 };
        }
        return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, split(v)]));
      }
      return value;
    };
    const t = tracePayload('binary').timeline;
    const msg = split({ type: 'window', id: 3, timeline: { ...t, window: [0, 6], per_column: 1 }, lives: { ...payload, exact: [2, 5], stacks: [[['a.py', 1, 'f']]], sites: ['a.py:1'] } });
    const answer = decodeWindow(joinBuffers(msg, buffers) as Parameters<typeof decodeWindow>[0], 6);
    expect(answer.timeline.n).toBe(6);
    expect(answer.lives?.exact).toEqual([2, 5]);
    expect(answer.lives?.stacks).toEqual([[['a.py', 1, 'f']]]);
    expect(answer.lives?.blocks.n).toBe(TRACE_BLOCKS.length);
  });

  it('refuses a column that names a buffer the message lacks', () => {
    expect(() => joinBuffers({ a: { dtype: 'f8', buffer: 2 } }, [])).toThrow(/names buffer 2/);
  });
});

describe('when to ask for detail', () => {
  it('a series is too coarse where its columns are over twice as wide as the pixels', () => {
    const s = series(0, 2000, 5000); // 10 M events
    expect(tooCoarse(s, 0, 10_000_000, 1000)).toBe(false); // 10,000 events a pixel
    expect(tooCoarse(s, 4_000_000, 4_500_000, 1000)).toBe(true); // 500 a pixel
    expect(tooCoarse(series(0, 100, 1), 0, 10, 1000)).toBe(false); // exact: never
  });

  it('asks for the window with a quarter more on each side, inside the trace', () => {
    expect(windowToAsk(400, 800, 10_000)).toEqual([300, 901]);
    expect(windowToAsk(0, 100, 10_000)).toEqual([0, 126]);
    expect(windowToAsk(9_900, 9_999, 10_000)).toEqual([9_875, 10_000]);
  });

  it('draws the finest series known that covers the window', () => {
    const cache = new SeriesCache(series(0, 2000, 5000));
    const fine = series(4_000_000, 2000, 100);
    cache.add(fine);
    expect(cache.best(4_010_000, 4_100_000)).toBe(fine);
    expect(cache.best(3_900_000, 4_100_000)).toBe(cache.base); // not covered: the saved one
  });

  it('knows lives exact at an event: the saved ones at checkpoints, answers in their range', () => {
    const saved = lives(TRACE_BLOCKS, TRACE_SEGS, [-1, 3, 5]);
    const cache = new LivesCache(saved);
    expect(cache.exactAt(3)).toBe(saved);
    expect(cache.exactAt(4)).toBeNull();
    const answer = { ...lives(TRACE_BLOCKS, TRACE_SEGS), exact: [4, 5] as [number, number] };
    cache.add(answer);
    expect(cache.exactAt(4)).toBe(answer);
    expect(new LivesCache(lives(TRACE_BLOCKS, TRACE_SEGS)).exactAt(2)).not.toBeNull(); // all exact
  });

  it('says where the saved detail runs out, naming the file when there is one', () => {
    expect(coarseNote(5000, 'run.gpumem')).toBe('coarse: each column here sums up 5,000 events; the full trace is in run.gpumem');
    expect(coarseNote(5, null)).toContain('%%gpumem_trace --save run.gpumem');
    const v = decodePayload({ ...tracePayload(), lives: livesPayload(TRACE_BLOCKS, TRACE_SEGS, 'base64', [-1, 3, 5]), full_trace: 'x.gpumem' });
    expect(layoutNote(v, 4, 3)).toBe('the saved layout is exact at 3 events; showing event 3, the nearest to 4 (every event: x.gpumem)');
    expect(layoutNote(v, 3, 3)).toBe('');
  });
});

describe('columns and their steps', () => {
  it('finds the column holding an event', () => {
    const index = [0, 10, 20, 30];
    expect([-5, 0, 9, 10, 29, 30, 99].map(k => columnAt(index, k))).toEqual([0, 0, 0, 1, 2, 3, 3]);
    expect(columnAt([], 3)).toBe(-1);
  });

  it('holds the last column of a series up to the window end', () => {
    const sx = linearScale([0, 10], [0, 100]);
    const sy = linearScale([0, 10], [10, 0]);
    expect(stepPath({ x: [0, 5], y: [1, 2], n: 2 }, sx, sy)).toBe('M0,9H50V8');
    expect(stepPath({ x: [0, 5], y: [1, 2], n: 2 }, sx, sy, 9)).toBe('M0,9H50V8H90');
    expect(stepArea([0, 5], [3, 4], [1, 2], 2, sx, sy, 9)).toBe('M0,9V7H50V6H90V8H50V9H0Z');
  });
});
