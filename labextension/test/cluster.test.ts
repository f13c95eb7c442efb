import { describe, expect, it } from 'vitest';
import {
  agoText,
  agoTicks,
  cellColor,
  columnX,
  decodeRounds,
  EMPTY_COLOR,
  GONE,
  GONE_COLOR,
  heatColor,
  heatRGB,
  indexAt,
  LIVE,
  NF,
  orderWorkers,
  RoundWindow,
  rowLayout,
  rowNumbers,
  STALE,
  STALE_COLOR,
  summaryText,
  tipLines,
  type Cell,
  type Round,
  type WorkerInfo
} from '../src/cluster';

const GiB = 1024 ** 3;

function worker(row: number, name: string, over: Partial<WorkerInfo> = {}): WorkerInfo {
  return { row, address: `tcp://10.0.0.1:${4000 + row}`, name, gpu: row, total: 80 * GiB, state: 'live', why: '', ...over };
}

function round(index: number, cells: Array<[number, number, number]>, tasks: string[] = []): Round {
  // cells: [row, allocated, state]
  const values = new Float64Array(cells.length * NF);
  cells.forEach(([, a, st], k) => values.set([a, 2 * a, 3 * a, 0, 0, st], k * NF));
  return { index, t: index, rows: Int32Array.from(cells.map(c => c[0])), values, tasks: cells.map((_, k) => tasks[k] ?? '') };
}

describe('RoundWindow', () => {
  it('keeps the last capacity rounds, oldest first, and ignores repeats', () => {
    const w = new RoundWindow(3);
    for (let i = 0; i < 5; i++) {
      expect(w.push(round(i, [[0, i, LIVE]]))).toBe(true);
    }
    expect(w.push(round(2, [[0, 99, LIVE]]))).toBe(true); // already seen: ignored
    expect(w.rounds().map(r => r.index)).toEqual([2, 3, 4]);
    expect(w.next).toBe(5);
    expect(w.cell(0, 0)?.allocated).toBe(2);
    expect(w.cell(0, 7)).toBeUndefined();
  });
  it('says when a round leaves a gap', () => {
    const w = new RoundWindow(4);
    w.push(round(0, [[0, 1, LIVE]]));
    expect(w.push(round(3, [[0, 1, LIVE]]))).toBe(false);
  });
  it('finds the newest answer of a worker, skipping rounds it did not answer', () => {
    const w = new RoundWindow(4);
    w.push(round(0, [[0, 5, LIVE]], ['matmul']));
    w.push(round(1, [[0, NaN, STALE]]));
    expect(w.latest(0)).toMatchObject({ allocated: 5, reserved: 10, peak: 15, task: 'matmul' });
    expect(w.latest(1)).toBeUndefined();
  });
  it('refuses a capacity below one', () => {
    expect(() => new RoundWindow(0)).toThrow(/capacity/);
  });
});

describe('decodeRounds', () => {
  it('splits the buffers into rounds by their counts', () => {
    const rows = Int32Array.from([0, 1, 1]);
    const values = new Float64Array(3 * NF).map((_, i) => i);
    const got = decodeRounds(7, [1.5, 2.5], [2, 1], ['a', 'b', 'c'], rows, values);
    expect(got.map(r => [r.index, r.t, Array.from(r.rows), r.tasks])).toEqual([
      [7, 1.5, [0, 1], ['a', 'b']],
      [8, 2.5, [1], ['c']]
    ]);
    expect(Array.from(got[1].values)).toEqual(Array.from(values.subarray(2 * NF)));
  });
  it('refuses buffers that do not match the counts', () => {
    expect(() => decodeRounds(0, [0], [2], [], Int32Array.from([0]), new Float64Array(NF))).toThrow(/rows/);
  });
});

describe('colours', () => {
  it('runs viridis from dark purple to yellow, clamped', () => {
    expect(heatRGB(0)).toEqual([68, 1, 84]);
    expect(heatRGB(1)).toEqual([253, 231, 37]);
    expect(heatRGB(2)).toEqual(heatRGB(1));
    expect(heatRGB(-1)).toEqual(heatRGB(0));
    expect(heatColor(0.5)).toBe('rgb(33, 144, 141)');
  });
  it('paints a cell by allocated or reserved of the device, grey where stale or gone', () => {
    const c: Cell = { allocated: 40 * GiB, reserved: 80 * GiB, peak: 0, ooms: 0, retries: 0, state: LIVE, task: '' };
    expect(cellColor(c, 80 * GiB, 'allocated')).toBe(heatColor(0.5));
    expect(cellColor(c, 80 * GiB, 'reserved')).toBe(heatColor(1));
    expect(cellColor({ ...c, state: STALE }, 80 * GiB, 'allocated')).toBe(STALE_COLOR);
    expect(cellColor({ ...c, state: GONE }, 80 * GiB, 'allocated')).toBe(GONE_COLOR);
    expect(cellColor(undefined, 80 * GiB, 'allocated')).toBe(EMPTY_COLOR);
  });
});

describe('rowLayout', () => {
  it('labels every row of a few workers', () => {
    expect(rowLayout(4)).toEqual({ rowH: 18, labelEvery: 1, fontPx: 12, height: 72 });
  });
  it('shrinks rows at 64 workers and labels every other one', () => {
    const l = rowLayout(64);
    expect(l.rowH).toBe(8);
    expect(l.labelEvery).toBe(2);
    expect(l.height).toBe(512);
  });
  it('stops shrinking at the minimum row (the strip grows instead)', () => {
    const l = rowLayout(500);
    expect(l.rowH).toBe(5);
    expect(l.labelEvery).toBe(3);
    expect(l.height).toBe(2500);
  });
});

describe('columns', () => {
  it('puts the newest round at the right edge and maps x back to a round index', () => {
    expect(columnX(19, 100, 10, 19)).toEqual([90, 10]);
    expect(columnX(10, 100, 10, 19)).toEqual([0, 10]);
    expect(columnX(0, 100, 10, 1)).toEqual([80, 10]);
    expect(indexAt(85, 100, 10, 1)).toBe(0);
    expect(indexAt(95, 100, 10, 1)).toBe(1);
    expect(indexAt(50, 100, 10, 1)).toBe(-1); // before the first round
    expect(indexAt(0, 100, 10, 19)).toBe(10);
    expect(indexAt(100, 100, 10, 19)).toBe(-1);
  });
  it('finds a round by its index, gaps and all', () => {
    const w = new RoundWindow(3);
    for (const i of [0, 1, 4, 5]) {
      w.push(round(i, [[0, i, LIVE]]));
    }
    expect([1, 4, 5, 0, 2].map(i => w.find(i))).toEqual([0, 1, 2, -1, -1]);
  });
});

describe('workers', () => {
  it('orders numeric names as numbers, then other names', () => {
    const ws = [worker(0, '10'), worker(1, 'b'), worker(2, '2'), worker(3, 'a')];
    expect(orderWorkers(ws).map(w => w.name)).toEqual(['2', '10', 'a', 'b']);
  });
  it('gives the latest numbers, or why there are none', () => {
    const c: Cell = { allocated: GiB, reserved: 2 * GiB, peak: 3 * GiB, ooms: 0, retries: 0, state: LIVE, task: '' };
    expect(rowNumbers(worker(0, '0'), c)).toBe('1.0 GiB / 2.0 GiB / 3.0 GiB');
    expect(rowNumbers(worker(0, '0', { state: 'stale' }), c)).toBe('1.0 GiB / 2.0 GiB / 3.0 GiB (stale)');
    expect(rowNumbers(worker(0, '0', { state: 'gone' }), c)).toBe('gone');
    expect(rowNumbers(worker(0, '0'), undefined)).toBe('no answer');
  });
  it('says everything on hover', () => {
    const c: Cell = { allocated: 20 * GiB, reserved: 40 * GiB, peak: 60 * GiB, ooms: 1, retries: 2, state: LIVE, task: 'matmul' };
    expect(tipLines(worker(3, '3'), c, 12.25, 4)).toEqual([
      'worker 3 · GPU 3',
      'tcp://10.0.0.1:4003',
      't = 12.3 s (4.0 s ago)',
      'allocated 20.0 GiB (25%)',
      'reserved 40.0 GiB (50%) of 80.0 GiB',
      'peak 60.0 GiB · OOMs 1 · retries 2',
      'task: matmul'
    ]);
    expect(tipLines(worker(3, '3', { why: 'no answer in time' }), { ...c, state: STALE }, 1, 0).at(-1)).toBe('no answer: no answer in time');
    expect(tipLines(worker(3, '3'), undefined, 1, 0).at(-1)).toBe('no sample (not in the cluster then)');
  });
  it('sums the live workers and names the busiest and the OOMs', () => {
    const ws = [worker(0, '0'), worker(1, '1'), worker(2, '2', { state: 'gone' })];
    const latest = (row: number): Cell | undefined =>
      row === 2 ? undefined : { allocated: (row + 1) * 10 * GiB, reserved: 40 * GiB, peak: 0, ooms: row, retries: 0, state: LIVE, task: '' };
    expect(summaryText(ws, latest)).toBe(
      '2 workers, 1 gone · allocated 30.0 GiB · reserved 80.0 GiB of 160 GiB · busiest: 1 · GPU 1 at 20.0 GiB (25%) · OOMs: 1 on 1 worker'
    );
  });
});

describe('time axis', () => {
  it('ticks at a round step back from now', () => {
    expect(agoTicks(600)).toEqual([0, 120, 240, 360, 480, 600]);
    expect(agoTicks(10)).toEqual([0, 2, 4, 6, 8, 10]);
    expect(agoText(0)).toBe('now');
    expect(agoText(30)).toBe('-30 s');
    expect(agoText(240)).toBe('-4 min');
  });
});
