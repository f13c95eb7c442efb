// Detail beyond the saved view: what a kernel answers (a window's timeline and lives, the
// layout at one event), the series and lives known so far, and when to ask. No DOM.
import type { ColumnData, DecodedTimeline, Lives, LivesPayload, TimelinePayload, View } from './payload';
import { decodeLives, decodeTimeline } from './payload';

/** A kernel's answer to "events [i0, i1) in `columns` columns". */
export interface WindowAnswer {
  timeline: DecodedTimeline;
  /** Every block and segment live in the window, or null when there were too many. */
  lives: Lives | null;
}

/** Where detail comes from: the widget's kernel. A saved view has none. */
export interface DetailSource {
  window(i0: number, i1: number, columns: number): Promise<WindowAnswer>;
  layout(k: number): Promise<Lives>;
}

/** Columns a view asks a window in: one a pixel of a wide plot, as the saved view has. */
export const ASK_COLUMNS = 2000;

/**
 * `content` with every `{dtype, buffer: j}` made `{dtype, data: buffers[j]}`: a widget's custom
 * message carries its columns' bytes as buffers.
 */
export function joinBuffers(content: unknown, buffers: ReadonlyArray<ColumnData>): unknown {
  if (Array.isArray(content)) {
    return content.map(v => joinBuffers(v, buffers));
  }
  if (content && typeof content === 'object') {
    const o = content as Record<string, unknown>;
    if (typeof o.dtype === 'string' && typeof o.buffer === 'number' && Object.keys(o).length === 2) {
      const data = buffers[o.buffer];
      if (data === undefined) {
        throw new TypeError(`a column names buffer ${o.buffer}, the message has ${buffers.length}`);
      }
      return { dtype: o.dtype, data };
    }
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(o)) {
      out[k] = joinBuffers(v, buffers);
    }
    return out;
  }
  return content;
}

/** Decode a window answer (its buffers joined) of a trace of `nEvents` events. */
export function decodeWindow(msg: { timeline?: TimelinePayload; lives?: LivesPayload | null }, nEvents: number): WindowAnswer {
  if (!msg.timeline) {
    throw new TypeError('a window answer without a timeline');
  }
  return { timeline: decodeTimeline(msg.timeline, nEvents), lives: msg.lives ? decodeLives(msg.lives) : null };
}

/** Events per pixel of the window [lo, hi] drawn `px` pixels wide. */
export function eventsPerPixel(lo: number, hi: number, px: number): number {
  return Math.max(hi - lo, 1) / Math.max(px, 1);
}

/** Whether `series` is too coarse for [lo, hi] in `px` pixels: its columns wider than two. */
export function tooCoarse(series: DecodedTimeline, lo: number, hi: number, px: number): boolean {
  return series.perColumn > 1 && series.perColumn > 2 * eventsPerPixel(lo, hi, px);
}

/** The window to ask for to draw [lo, hi]: a quarter more on each side, whole events. */
export function windowToAsk(lo: number, hi: number, nEvents: number): [number, number] {
  const margin = (hi - lo) / 4;
  const i0 = Math.max(0, Math.floor(lo - margin));
  const i1 = Math.min(nEvents, Math.ceil(hi + margin) + 1);
  return [i0, Math.max(i1, Math.min(i0 + 1, nEvents))];
}

/** The series known so far, the saved one first: the finest one that covers a window. */
export class SeriesCache {
  private readonly refined: DecodedTimeline[] = [];

  constructor(readonly base: DecodedTimeline, private readonly keep = 6) {}

  add(series: DecodedTimeline): void {
    this.refined.unshift(series);
    this.refined.length = Math.min(this.refined.length, this.keep);
  }

  /** The finest series covering [lo, hi] (the saved one if none finer does). */
  best(lo: number, hi: number): DecodedTimeline {
    let out = this.base;
    for (const s of this.refined) {
      if (s.window[0] <= Math.max(lo, 0) && s.window[1] - 1 >= Math.floor(hi) && s.perColumn < out.perColumn) {
        out = s;
      }
    }
    return out;
  }
}

/** Lives known so far: the saved ones (exact everywhere or at checkpoints), and answers. */
export class LivesCache {
  private readonly answers: Lives[] = [];

  constructor(readonly saved: Lives, private readonly keep = 8) {}

  add(lives: Lives): void {
    this.answers.unshift(lives);
    this.answers.length = Math.min(this.answers.length, this.keep);
  }

  /** Lives that are every life there is after event k, or null. */
  exactAt(k: number): Lives | null {
    for (const l of this.answers) {
      if (l.exact && l.exact[0] <= k && k < l.exact[1]) {
        return l;
      }
    }
    const cps = this.saved.checkpoints;
    return cps === null || cps.includes(k) ? this.saved : null;
  }
}

/** Lines a view shows where its saved detail runs out (no kernel to ask). */
export function coarseNote(perColumn: number, fullTrace: string | null | undefined): string {
  const per = `each column here sums up ${perColumn.toLocaleString('en-US')} events`;
  return fullTrace
    ? `coarse: ${per}; the full trace is in ${fullTrace}`
    : `coarse: ${per}; to keep every event, save the trace (%%gpumem_trace --save run.gpumem) and load it in a kernel`;
}

/** What a view without a kernel says of the layout at a wish for event `wanted`. */
export function layoutNote(view: View, wanted: number, shown: number): string {
  const cps = view.lives.checkpoints;
  if (cps === null || wanted === shown) {
    return '';
  }
  const file = view.raw.full_trace;
  return (
    `the saved layout is exact at ${cps.length.toLocaleString('en-US')} events; showing event ${shown.toLocaleString('en-US')}, the nearest to ${Math.round(wanted).toLocaleString('en-US')}` +
    (file ? ` (every event: ${file})` : '')
  );
}
