// The cluster heat strip's data and arithmetic, with no DOM: the window of sampling rounds
// (a bounded ring), the colour scale, the row layout at many workers, and the texts shown.
import { formatBytes } from './format';

/** Columns of a round's values, as the kernel's `jupyter_gpumem.dask.live.FIELDS`. */
export const FIELDS = ['allocated', 'reserved', 'peak', 'ooms', 'retries', 'state'] as const;
export const NF = FIELDS.length;
export const F_ALLOCATED = 0;
export const F_RESERVED = 1;
export const F_PEAK = 2;
export const F_OOMS = 3;
export const F_RETRIES = 4;
export const F_STATE = 5;
/** A worker's state in a round. */
export const LIVE = 0;
export const STALE = 1;
export const GONE = 2;

export type ColorBy = 'allocated' | 'reserved';

/** A worker as the `workers` trait lists it. */
export interface WorkerInfo {
  row: number;
  address: string;
  name: string;
  gpu: number;
  total: number;
  state: string;
  why: string;
}

/** One sampling round: its index, time (s since start), and per worker in it: row, values, task. */
export interface Round {
  index: number;
  t: number;
  rows: Int32Array;
  values: Float64Array; // rows.length x NF
  tasks: string[];
}

/** One worker's values in a round (NaN where it did not answer). */
export interface Cell {
  allocated: number;
  reserved: number;
  peak: number;
  ooms: number;
  retries: number;
  state: number;
  task: string;
}

/** The last `capacity` rounds, oldest first. */
export class RoundWindow {
  private readonly ring: Round[] = [];
  private start = 0;
  constructor(readonly capacity: number) {
    if (!(capacity >= 1)) {
      throw new Error(`capacity must be at least 1, got ${capacity}`);
    }
  }

  get length(): number {
    return this.ring.length;
  }

  /** The index the next round should have (0 when empty). */
  get next(): number {
    return this.ring.length ? this.at(this.ring.length - 1).index + 1 : 0;
  }

  at(i: number): Round {
    return this.ring[(this.start + i) % this.ring.length];
  }

  /** Add a round; one already there (by index) is ignored. False if it leaves a gap. */
  push(r: Round): boolean {
    if (this.ring.length && r.index < this.next) {
      return true;
    }
    const gap = this.ring.length > 0 && r.index > this.next;
    if (this.ring.length < this.capacity) {
      this.ring.push(r);
    } else {
      this.ring[this.start] = r;
      this.start = (this.start + 1) % this.capacity;
    }
    return !gap;
  }

  /** The position in the window of the round with this index, -1 if it is not there. */
  find(index: number): number {
    let lo = 0;
    let hi = this.ring.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const at = this.at(mid).index;
      if (at === index) {
        return mid;
      }
      if (at < index) {
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    return -1;
  }

  /** Oldest first. */
  rounds(): Round[] {
    const out: Round[] = [];
    for (let i = 0; i < this.ring.length; i++) {
      out.push(this.at(i));
    }
    return out;
  }

  /** The value of worker `row` in round i of the window (undefined when absent). */
  cell(i: number, row: number): Cell | undefined {
    const r = this.at(i);
    const k = r.rows.indexOf(row);
    if (k < 0) {
      return undefined;
    }
    const v = r.values.subarray(k * NF, k * NF + NF);
    return {
      allocated: v[F_ALLOCATED],
      reserved: v[F_RESERVED],
      peak: v[F_PEAK],
      ooms: v[F_OOMS],
      retries: v[F_RETRIES],
      state: v[F_STATE],
      task: r.tasks[k] ?? ''
    };
  }

  /** The newest answer of worker `row` in the window (state LIVE), if any. */
  latest(row: number): Cell | undefined {
    for (let i = this.ring.length - 1; i >= 0; i--) {
      const c = this.cell(i, row);
      if (c && c.state === LIVE) {
        return c;
      }
    }
    return undefined;
  }
}

/**
 * Decode a "rounds" message: `counts[j]` rows per round, rows (int32) and values (float64, NF a
 * row) back to back, `tasks` one per row.
 */
export function decodeRounds(
  first: number,
  t: number[],
  counts: number[],
  tasks: string[],
  rows: Int32Array,
  values: Float64Array
): Round[] {
  const total = counts.reduce((a, b) => a + b, 0);
  if (t.length !== counts.length || rows.length !== total || values.length !== total * NF) {
    throw new Error(`a rounds message with ${rows.length} rows and ${values.length} values for ${total} rows`);
  }
  const out: Round[] = [];
  let at = 0;
  for (let j = 0; j < counts.length; j++) {
    const n = counts[j];
    out.push({
      index: first + j,
      t: t[j],
      rows: rows.slice(at, at + n),
      values: values.slice(at * NF, (at + n) * NF),
      tasks: tasks.slice(at, at + n).map(s => String(s ?? ''))
    });
    at += n;
  }
  return out;
}

// viridis at 9 stops (matplotlib's, as the static picture uses)
const VIRIDIS: ReadonlyArray<readonly [number, number, number]> = [
  [68, 1, 84],
  [71, 44, 122],
  [59, 81, 139],
  [44, 113, 142],
  [33, 144, 141],
  [39, 173, 129],
  [92, 200, 99],
  [170, 220, 50],
  [253, 231, 37]
];
/** Where a worker gave no answer in time, and where it had left. */
export const STALE_COLOR = '#d9d9d9';
export const GONE_COLOR = '#6b6b6b';
export const EMPTY_COLOR = '#f4f4f4';

/** The colour of a fraction in [0, 1] (clamped) as [r, g, b]. */
export function heatRGB(fraction: number): [number, number, number] {
  const f = Number.isFinite(fraction) ? Math.min(1, Math.max(0, fraction)) : 0;
  const x = f * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const u = x - i;
  const a = VIRIDIS[i];
  const b = VIRIDIS[i + 1];
  return [0, 1, 2].map(c => Math.round(a[c] + (b[c] - a[c]) * u)) as [number, number, number];
}

export function heatColor(fraction: number): string {
  const [r, g, b] = heatRGB(fraction);
  return `rgb(${r}, ${g}, ${b})`;
}

/** The fill of a cell: the heat colour of value/total; grey where stale, dark where gone. */
export function cellColor(cell: Cell | undefined, total: number, by: ColorBy): string {
  if (!cell) {
    return EMPTY_COLOR;
  }
  if (cell.state === GONE) {
    return GONE_COLOR;
  }
  const v = by === 'reserved' ? cell.reserved : cell.allocated;
  if (cell.state !== LIVE || !Number.isFinite(v)) {
    return STALE_COLOR;
  }
  return heatColor(total > 0 ? v / total : 0);
}

export interface RowLayout {
  rowH: number; // px a row
  labelEvery: number; // a label on every k-th row
  fontPx: number;
  height: number; // px of all rows
}

/**
 * Rows of `n` workers in at most `maxHeight` px: rows shrink from `maxRow` to `minRow` (then the
 * strip grows past maxHeight); a label needs `labelPx` px, so with thinner rows only every k-th
 * row is labelled (the hover names every row).
 */
export function rowLayout(n: number, maxHeight = 520, minRow = 5, maxRow = 18, labelPx = 11): RowLayout {
  const rows = Math.max(1, n);
  const rowH = Math.max(minRow, Math.min(maxRow, Math.floor(maxHeight / rows)));
  const labelEvery = Math.max(1, Math.ceil(labelPx / rowH));
  const fontPx = Math.max(9, Math.min(12, rowH - 2));
  return { rowH, labelEvery, fontPx, height: rowH * rows };
}

/** Whether row i of n gets its label: every k-th, and always a worker that is gone or stale. */
export function showsLabel(i: number, layout: RowLayout): boolean {
  return i % layout.labelEvery === 0;
}

/** Sort workers for display: numeric names in number order, then the others by name, address. */
export function orderWorkers(workers: readonly WorkerInfo[]): WorkerInfo[] {
  const key = (w: WorkerInfo): [number, number, string] =>
    /^\d+$/.test(w.name) ? [0, Number(w.name), w.address] : [1, 0, `${w.name}\u0000${w.address}`];
  return [...workers].sort((a, b) => {
    const ka = key(a);
    const kb = key(b);
    return ka[0] - kb[0] || ka[1] - kb[1] || (ka[2] < kb[2] ? -1 : ka[2] > kb[2] ? 1 : 0);
  });
}

/** A row's label: its short name and its GPU ("3 · GPU 3"). */
export function rowLabel(w: WorkerInfo): string {
  return w.gpu >= 0 ? `${w.name} · GPU ${w.gpu}` : w.name;
}

/**
 * The strip shows the `capacity` round indexes up to `newest`, one column each, the newest at
 * the right edge (a round that never arrived leaves its column blank). The round index under x
 * in a strip of `width` px, -1 outside.
 */
export function indexAt(x: number, width: number, capacity: number, newest: number): number {
  if (!(width > 0) || x < 0 || x >= width) {
    return -1;
  }
  const index = newest - capacity + 1 + Math.floor((x / width) * capacity);
  return index >= 0 ? index : -1;
}

/** The x of round `index`'s left edge, and the column width, in the same strip. */
export function columnX(index: number, width: number, capacity: number, newest: number): [number, number] {
  const w = width / capacity;
  return [(index - (newest - capacity + 1)) * w, w];
}

function pct(v: number, total: number): string {
  return total > 0 && Number.isFinite(v) ? ` (${Math.round((100 * v) / total)}%)` : '';
}

/** The hover text of worker `w` in a round at time `t` (seconds before the newest: `ago`). */
export function tipLines(w: WorkerInfo, cell: Cell | undefined, t: number, ago: number): string[] {
  const lines = [`worker ${w.name}${w.gpu >= 0 ? ` · GPU ${w.gpu}` : ''}`, w.address, `t = ${t.toFixed(1)} s (${ago.toFixed(1)} s ago)`];
  if (!cell) {
    lines.push('no sample (not in the cluster then)');
  } else if (cell.state === GONE) {
    lines.push(`gone: ${w.why || 'left the cluster'}`);
  } else if (cell.state === STALE) {
    lines.push(`no answer: ${w.why || 'stale'}`);
  } else {
    lines.push(
      `allocated ${formatBytes(cell.allocated)}${pct(cell.allocated, w.total)}`,
      `reserved ${formatBytes(cell.reserved)}${pct(cell.reserved, w.total)} of ${formatBytes(w.total)}`,
      `peak ${formatBytes(cell.peak)} · OOMs ${cell.ooms} · retries ${cell.retries}`,
      `task: ${cell.task || '(idle)'}`
    );
  }
  return lines;
}

/** The numbers at a row's right: allocated / reserved / peak (or why there are none). */
export function rowNumbers(w: WorkerInfo, latest: Cell | undefined): string {
  if (w.state === 'gone') {
    return 'gone';
  }
  if (!latest) {
    return 'no answer';
  }
  const s = `${formatBytes(latest.allocated)} / ${formatBytes(latest.reserved)} / ${formatBytes(latest.peak)}`;
  return w.state === 'stale' ? `${s} (stale)` : s;
}

/** The summary line: workers, total allocated/reserved of the device totals, busiest, OOMs. */
export function summaryText(workers: readonly WorkerInfo[], latest: (row: number) => Cell | undefined): string {
  let alloc = 0;
  let reserved = 0;
  let total = 0;
  let ooms = 0;
  let oomWorkers = 0;
  let busiest: { w: WorkerInfo; c: Cell } | null = null;
  let gone = 0;
  let stale = 0;
  for (const w of workers) {
    if (w.state === 'gone') {
      gone += 1;
      continue;
    }
    if (w.state === 'stale') {
      stale += 1;
    }
    total += w.total;
    const c = latest(w.row);
    if (!c) {
      continue;
    }
    alloc += c.allocated;
    reserved += c.reserved;
    if (c.ooms > 0) {
      ooms += c.ooms;
      oomWorkers += 1;
    }
    const frac = (x: { w: WorkerInfo; c: Cell }) => (x.w.total > 0 ? x.c.allocated / x.w.total : x.c.allocated);
    if (busiest === null || frac({ w, c }) > frac(busiest)) {
      busiest = { w, c };
    }
  }
  const live = workers.length - gone;
  const parts = [
    `${live} worker${live === 1 ? '' : 's'}` + (stale ? ` (${stale} not answering)` : '') + (gone ? `, ${gone} gone` : ''),
    `allocated ${formatBytes(alloc)} · reserved ${formatBytes(reserved)} of ${formatBytes(total)}`
  ];
  if (busiest) {
    parts.push(`busiest: ${rowLabel(busiest.w)} at ${formatBytes(busiest.c.allocated)}${pct(busiest.c.allocated, busiest.w.total)}`);
  }
  parts.push(ooms ? `OOMs: ${ooms} on ${oomWorkers} worker${oomWorkers === 1 ? '' : 's'}` : 'no OOMs');
  return parts.join(' · ');
}

/** Time ticks for a window of `span` seconds ending now: seconds ago, at a round step. */
export function agoTicks(span: number, maxTicks = 6): number[] {
  if (!(span > 0)) {
    return [0];
  }
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600];
  const step = steps.find(s => span / s <= maxTicks) ?? Math.ceil(span / maxTicks);
  const out: number[] = [];
  for (let a = 0; a <= span + 1e-9; a += step) {
    out.push(a);
  }
  return out;
}

/** A tick's text: "now", "-30 s", "-2 min". */
export function agoText(a: number): string {
  if (a === 0) {
    return 'now';
  }
  return a >= 120 && a % 60 === 0 ? `-${a / 60} min` : `-${a} s`;
}
