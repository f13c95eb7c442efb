// The session as the panel holds it: a bounded series a memory source and device (a lane), and
// where each cell ran, on the session's time axis (seconds spent running cells). No DOM.
import type { Samples } from '../payload';
import { type CellSpan, type Lane, LIVE_POINTS, type SampleRow } from './schema';

/** Cells' spans kept. */
export const MAX_SPANS = 500;

/**
 * Indices of at most about `maxPoints` of `rows` that keep each bucket's lowest and highest
 * allocated and reserved row, and the first and last: a curve drawn from them keeps its peak
 * and its dips. Sorted, no repeats.
 */
export function keepExtremes(rows: readonly SampleRow[], maxPoints: number): number[] {
  const n = rows.length;
  if (n <= maxPoints) {
    return Array.from({ length: n }, (_, i) => i);
  }
  const buckets = Math.max(1, Math.floor((maxPoints - 2) / 4));
  const width = Math.ceil(n / buckets);
  const picks = new Set<number>([0, n - 1]);
  for (let b = 0; b < n; b += width) {
    const end = Math.min(n, b + width);
    for (const col of [1, 2] as const) {
      let lo = b;
      let hi = b;
      for (let i = b + 1; i < end; i++) {
        if (rows[i][col] < rows[lo][col]) {
          lo = i;
        }
        if (rows[i][col] > rows[hi][col]) {
          hi = i;
        }
      }
      picks.add(lo);
      picks.add(hi);
    }
  }
  return [...picks].sort((a, b) => a - b);
}

/** `rows` cut to at most about `maxPoints`, keeping the extremes (`keepExtremes`). */
export function cutBack(rows: readonly SampleRow[], maxPoints: number): SampleRow[] {
  return keepExtremes(rows, maxPoints).map(i => rows[i]);
}

/** The highest allocated row of a lane: its index, or -1 for no rows. */
export function peakIndex(rows: readonly SampleRow[]): number {
  let best = -1;
  for (let i = 0; i < rows.length; i++) {
    if (best < 0 || rows[i][1] > rows[best][1]) {
      best = i;
    }
  }
  return best;
}

/** Rows as the views' `Samples` (typed columns; NaN where the device's use is unknown). */
export function toSamples(rows: readonly SampleRow[]): Samples {
  const n = rows.length;
  const out: Samples = {
    n,
    t: new Float64Array(n),
    allocated: new Float64Array(n),
    reserved: new Float64Array(n),
    device: new Float64Array(n)
  };
  rows.forEach(([t, a, r, d], i) => {
    out.t[i] = t;
    out.allocated[i] = a;
    out.reserved[i] = r;
    out.device[i] = d === null ? NaN : d;
  });
  return out;
}

/**
 * `rows` with the last reading held a little to the right (a twentieth of the span, at least
 * 0.1 s): the level after the last cell, drawn with some width rather than as a point at the
 * axis's end. Unchanged when there are no rows.
 */
export function withTail(rows: readonly SampleRow[]): SampleRow[] {
  if (rows.length === 0) {
    return [];
  }
  const last = rows[rows.length - 1];
  const tail = Math.max(0.1, (last[0] - rows[0][0]) / 20);
  return [...rows, [last[0] + tail, last[1], last[2], last[3]]];
}

/** The span a time falls in (the last one starting at or before it), or null. */
export function spanAt(spans: readonly CellSpan[], t: number): CellSpan | null {
  let found: CellSpan | null = null;
  for (const s of spans) {
    if (s.start <= t) {
      found = s;
    } else {
      break;
    }
  }
  return found;
}

/** Lanes and cells' spans, bounded; rows come in by time (an older row is passed over). */
export class SessionSeries {
  private readonly lanes = new Map<string, Lane>();
  private _spans: CellSpan[] = [];

  constructor(
    readonly maxPoints = LIVE_POINTS,
    readonly maxSpans = MAX_SPANS
  ) {}

  /** Forget everything, then take `lanes` and `spans` (a state message, or a saved record). */
  reset(lanes: readonly Lane[], spans: readonly CellSpan[]): void {
    this.lanes.clear();
    for (const lane of lanes) {
      this.addLane(lane);
      this.append(lane.key, lane.samples);
    }
    this._spans = spans.slice(-this.maxSpans).map(s => ({ ...s }));
  }

  /** Know `lane` (its rows, if any, are not taken: `append` them). */
  addLane(lane: Lane): void {
    if (!this.lanes.has(lane.key)) {
      this.lanes.set(lane.key, { ...lane, samples: [] });
    }
  }

  /**
   * Add rows to lane `key` (made, named by its key, if unknown): a row later than the lane's
   * last is appended, one at the same time replaces it, an older one is passed over.
   */
  append(key: string, rows: readonly SampleRow[]): void {
    let lane = this.lanes.get(key);
    if (!lane) {
      const [source, device] = key.split(':');
      lane = { key, source, device: Number(device) || 0, device_name: '', samples: [] };
      this.lanes.set(key, lane);
    }
    const own = lane.samples;
    for (const row of rows) {
      const last = own.length ? own[own.length - 1][0] : -Infinity;
      if (row[0] > last) {
        own.push([...row] as SampleRow);
      } else if (row[0] === last) {
        own[own.length - 1] = [...row] as SampleRow;
      }
    }
    if (own.length > 2 * this.maxPoints) {
      lane.samples = cutBack(own, this.maxPoints);
    }
  }

  /** A cell's span: a new one, or the same cell's (by start) updated. */
  putSpan(span: CellSpan): void {
    const same = this._spans.findIndex(s => s.start === span.start);
    if (same >= 0) {
      this._spans[same] = { ...span };
    } else {
      this._spans.push({ ...span });
      this._spans.sort((a, b) => a.start - b.start);
      if (this._spans.length > this.maxSpans) {
        this._spans.splice(0, this._spans.length - this.maxSpans);
      }
    }
  }

  get spans(): readonly CellSpan[] {
    return this._spans;
  }

  /** Every lane, in the order they came. */
  allLanes(): Lane[] {
    return [...this.lanes.values()];
  }

  get empty(): boolean {
    return this.lanes.size === 0 && this._spans.length === 0;
  }

  /** Lanes and spans bounded for a notebook's metadata (`saved` of them each). */
  saved(points: number, spans: number): { lanes: Lane[]; spans: CellSpan[] } {
    return {
      lanes: this.allLanes().map(l => ({ ...l, samples: cutBack(l.samples, points) })),
      spans: this._spans.slice(-spans).map(s => ({ ...s }))
    };
  }
}
