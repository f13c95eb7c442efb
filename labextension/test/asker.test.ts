import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ASK_AFTER_MS, DetailAsker } from '../src/asker';
import type { DetailSource, WindowAnswer } from '../src/detail';
import { decodePayload, decodeTimeline, type DecodedTimeline, type Lives, type View } from '../src/payload';
import { col, lives, livesPayload, TRACE_BLOCKS, TRACE_SEGS, tracePayload } from './helpers';

const N = 6_000_000;

/** The test trace's payload stretched to N events in 6 columns, saved lives at checkpoints. */
function longView(fullTrace: string | null = 'run.gpumem'): View {
  const p = tracePayload('binary');
  return decodePayload({
    ...p,
    n_events: N,
    full_trace: fullTrace,
    timeline: { ...p.timeline, index: col('i4', [0, 1, 2, 3, 4, 5].map(c => c * 1_000_000)), window: [0, N], per_column: 1_000_000 },
    lives: livesPayload(TRACE_BLOCKS, TRACE_SEGS, 'binary', [-1, 3, 5, N - 1])
  });
}

function fine(i0: number, i1: number): DecodedTimeline {
  const n = i1 - i0;
  const index = Array.from({ length: n }, (_, c) => i0 + c);
  const zeros = index.map(() => 0);
  return decodeTimeline(
    { index: col('i4', index), time_us: col('f8', zeros), allocated: col('f8', zeros), reserved: col('f8', zeros), bands: [], band_labels: [], band_sites: [], window: [i0, i1], per_column: 1 },
    N
  );
}

/** A view's drawing, recorded; it shows the window `shown`. */
function recorder(shown: [number, number, number]) {
  const drawn = {
    series: [] as DecodedTimeline[],
    notes: [] as Array<[string, string]>,
    layouts: [] as Array<[number, Lives, string]>,
    asking: [] as number[],
    shown
  };
  return {
    drawn,
    draw: {
      series: (s: DecodedTimeline) => drawn.series.push(s),
      note: (text: string, state: string) => drawn.notes.push([text, state]),
      layout: (k: number, l: Lives, note: string) => drawn.layouts.push([k, l, note]),
      asking: (k: number) => drawn.asking.push(k),
      shown: () => drawn.shown
    }
  };
}

/** A kernel whose answers the test settles by hand. */
function kernel() {
  const windows: Array<{ i0: number; i1: number; ok: (a: WindowAnswer) => void; no: (e: Error) => void }> = [];
  const layouts: Array<{ k: number; ok: (l: Lives) => void; no: (e: Error) => void }> = [];
  const source: DetailSource = {
    window: (i0, i1) => new Promise((ok, no) => windows.push({ i0, i1, ok, no })),
    layout: k => new Promise((ok, no) => layouts.push({ k, ok, no }))
  };
  return { source, windows, layouts };
}

beforeEach(() => vi.useFakeTimers());
afterEach(() => vi.useRealTimers());

describe('DetailAsker, zooming', () => {
  it('with no kernel, says where the saved columns run out and names the file', () => {
    const { drawn, draw } = recorder([2_000_000, 2_100_000, 1000]);
    const asker = new DetailAsker(longView(), draw);
    asker.zoomed(...drawn.shown);
    expect(drawn.notes.at(-1)).toEqual(['coarse: each column here sums up 1,000,000 events; the full trace is in run.gpumem', 'coarse']);
    asker.zoomed(0, N, 3); // 2,000,000 events a pixel: the saved columns are fine enough
    expect(drawn.notes.at(-1)).toEqual(['', '']);
  });

  it('asks the kernel once the zoom rests, and draws the answer', async () => {
    const { drawn, draw } = recorder([2_000_000, 2_000_400, 1000]);
    const k = kernel();
    const asker = new DetailAsker(longView(), draw, k.source);
    asker.zoomed(1_000_000, 3_000_000, 1000);
    asker.zoomed(...drawn.shown); // a second wheel step before the first was asked
    expect(drawn.notes.at(-1)?.[1]).toBe('loading');
    vi.advanceTimersByTime(ASK_AFTER_MS.window);
    expect(k.windows.map(w => [w.i0, w.i1])).toEqual([[1_999_900, 2_000_501]]); // the latest only
    const answer = fine(1_999_900, 2_000_501);
    k.windows[0].ok({ timeline: answer, lives: null });
    await vi.runAllTimersAsync();
    expect(drawn.series.at(-1)).toBe(answer);
    expect(drawn.notes.at(-1)).toEqual(['', '']);
  });

  it('keeps an answer to an older question but draws the latest', async () => {
    const { drawn, draw } = recorder([2_000_000, 2_000_400, 1000]);
    const k = kernel();
    const asker = new DetailAsker(longView(), draw, k.source);
    asker.zoomed(...drawn.shown);
    vi.advanceTimersByTime(ASK_AFTER_MS.window);
    drawn.shown = [4_000_000, 4_000_400, 1000]; // the user moved on
    asker.zoomed(...drawn.shown);
    vi.advanceTimersByTime(ASK_AFTER_MS.window);
    expect(k.windows).toHaveLength(2);
    const old = fine(1_999_900, 2_000_501);
    k.windows[0].ok({ timeline: old, lives: null });
    await vi.runAllTimersAsync();
    expect(drawn.series).not.toContain(old);
    const latest = fine(3_999_900, 4_000_501);
    k.windows[1].ok({ timeline: latest, lives: null });
    await vi.runAllTimersAsync();
    expect(drawn.series.at(-1)).toBe(latest);
    drawn.shown = [2_000_000, 2_000_400, 1000]; // back: the older answer is there already
    asker.zoomed(...drawn.shown);
    expect(drawn.series.at(-1)).toBe(old);
  });

  it('says so when the kernel does not answer', async () => {
    const { drawn, draw } = recorder([2_000_000, 2_000_400, 1000]);
    const k = kernel();
    new DetailAsker(longView(), draw, k.source).zoomed(...drawn.shown);
    vi.advanceTimersByTime(ASK_AFTER_MS.window);
    k.windows[0].no(new Error('no answer in 20 s'));
    await vi.runAllTimersAsync();
    expect(drawn.notes.at(-1)?.[0]).toMatch(/^the kernel did not answer \(no answer in 20 s\); coarse: /);
  });
});

describe('DetailAsker, the layout at an event', () => {
  it('draws the saved lives at a checkpoint, the nearest one elsewhere with no kernel', () => {
    const { drawn, draw } = recorder([0, N, 1000]);
    const asker = new DetailAsker(longView(), draw);
    asker.layoutAt(3);
    expect(drawn.layouts.at(-1)?.[0]).toBe(3);
    expect(drawn.layouts.at(-1)?.[2]).toBe('');
    asker.layoutAt(2_000_000);
    const [k, , note] = drawn.layouts.at(-1)!;
    expect(k).toBe(5); // the nearest of -1, 3, 5 and N-1
    expect(note).toContain('exact at 4 events; showing event 5, the nearest to 2,000,000 (every event: run.gpumem)');
  });

  it('asks the kernel for any other event and draws its answer', async () => {
    const { drawn, draw } = recorder([0, N, 1000]);
    const k = kernel();
    const asker = new DetailAsker(longView(), draw, k.source);
    asker.layoutAt(2_000_000);
    expect(drawn.asking).toEqual([2_000_000]);
    vi.advanceTimersByTime(ASK_AFTER_MS.layout);
    expect(k.layouts.map(q => q.k)).toEqual([2_000_000]);
    const answer = { ...lives(TRACE_BLOCKS, TRACE_SEGS), exact: [2_000_000, 2_000_001] as [number, number] };
    k.layouts[0].ok(answer);
    await vi.runAllTimersAsync();
    expect(drawn.layouts.at(-1)).toEqual([2_000_000, answer, '']);
    asker.layoutAt(2_000_000); // known now: no second question
    expect(drawn.layouts.at(-1)?.[1]).toBe(answer);
    vi.advanceTimersByTime(ASK_AFTER_MS.layout);
    expect(k.layouts).toHaveLength(1);
  });

  it('falls back to the nearest saved layout when the kernel fails', async () => {
    const { drawn, draw } = recorder([0, N, 1000]);
    const k = kernel();
    new DetailAsker(longView(), draw, k.source).layoutAt(2_000_000);
    vi.advanceTimersByTime(ASK_AFTER_MS.layout);
    k.layouts[0].no(new Error('the view closed'));
    await vi.runAllTimersAsync();
    const [shown, , note] = drawn.layouts.at(-1)!;
    expect(shown).toBe(5);
    expect(note).toMatch(/^the kernel did not answer \(the view closed\); the saved layout is exact/);
  });
});
