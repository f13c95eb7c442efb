// The view payload (schema 2) and its decoding into typed arrays. No DOM.
import { type Column, decodeColumn, f64, i32 } from './columns';

export { base64Bytes, bytesOf, type Column, type ColumnData, decodeColumn, f64, i32, type Typed } from './columns';

export type Frame = [filename: string, line: number, name: string];

/**
 * The timeline: a level-of-detail series. Column c holds events index[c] .. index[c+1]-1 (the
 * last up to window[1]-1); `allocated`/`reserved` are the highest after any of its events, the
 * `_min` ones the lowest, the bands are at `peak_at`. An older payload has points kept by a
 * downsampling and none of the level-of-detail fields.
 */
export interface TimelinePayload {
  index: Column;
  time_us: Column;
  allocated: Column;
  reserved: Column;
  allocated_min?: Column;
  reserved_min?: Column;
  peak_at?: Column;
  bands: Column[];
  band_labels: string[];
  /** What the bands are by: "site" (the top sites, then "other") or "holder". */
  bands_by?: 'site' | 'holder';
  /** Site bands: the site of each band but the last ("other"); holder bands: []. */
  band_sites: number[];
  /** The events [i0, i1) the columns cover. */
  window?: [number, number];
  /** Events in a full column (1: every event its own column, exact). */
  per_column?: number;
}

export interface LivesPayload {
  blocks: {
    start: Column;
    end: Column;
    addr: Column;
    size: Column;
    requested: Column;
    stack: Column;
    site: Column;
    cell: Column;
    /** The timeline band each block life's bytes are in (absent in older payloads). */
    band?: Column;
  };
  segments: {
    start: Column;
    end: Column;
    addr: Column;
    size: Column;
    stream: Column;
    small: Column;
    /** 1 for a mapped range of an expandable segment (absent in older payloads: none). */
    expandable?: Column;
    /** The expandable segment (one layout row) a mapped range is in; -1 for a classic one. */
    group?: Column;
    /** Bytes of virtual address space the expandable segment reserves; 0 unknown or classic. */
    range?: Column;
  };
  checkpoints: number[] | null;
  dropped: number;
  /** A kernel's answer: the events [lo, hi) at which these are every life there is. */
  exact?: [number, number];
  /** A kernel's answer: the stacks and sites its lives point to (a payload's are its own). */
  stacks?: Frame[][];
  sites?: string[];
}

export interface ViewPayload {
  schema: 2;
  kind: 'trace' | 'snapshot' | 'live';
  title: string;
  device: number;
  device_name: string;
  n_events: number;
  start_allocated: number;
  start_reserved: number;
  timeline: TimelinePayload;
  peak: { index: number; allocated: number; reserved: number };
  ooms: number[];
  n_ooms: number;
  cells: Array<[number, number]>;
  lives: LivesPayload;
  stacks: Frame[][];
  sites: string[];
  top_sites: Array<{ site: string; bytes: number; count: number }>;
  surviving: Array<{
    address: number;
    size: number;
    requested: number;
    site: string | null;
    holders: string[];
    stack: number;
  }>;
  /** What the surviving blocks past the listed ones add up to. */
  surviving_rest?: { count: number; bytes: number; site: string; at_site: number } | null;
  /** `[address, names]` of the blocks live at the end that something is known to hold. */
  block_holders?: Array<[number, string[]]>;
  /** The file holding every event of the trace (`%%gpumem_trace --save`). */
  full_trace?: string | null;
  /** Only when the traced code raised: `ValueError: boom`. */
  raised?: string;
  samples: { n: number; data: Column } | null;
}

/** Block lives, decoded: block i is live after event k when start[i] <= k < end[i]. */
export interface BlockLives {
  n: number;
  start: Int32Array;
  end: Int32Array;
  addr: Float64Array;
  size: Float64Array;
  requested: Float64Array;
  stack: Int32Array;
  site: Int32Array;
  cell: Int32Array;
  /** The band of each life; empty when the payload has no band column (then: by site). */
  band: Int32Array;
}

export interface SegmentLives {
  n: number;
  start: Int32Array;
  end: Int32Array;
  addr: Float64Array;
  size: Float64Array;
  stream: Float64Array;
  small: Uint8Array;
  /** 1: a mapped range of an expandable segment (zeros for an older payload). */
  expandable: Uint8Array;
  /** The expandable segment a mapped range is in, -1 for a classic segment. */
  group: Int32Array;
  /** The virtual bytes an expandable segment reserves (0: unknown, or classic). */
  range: Float64Array;
}

export interface Lives {
  blocks: BlockLives;
  segments: SegmentLives;
  checkpoints: number[] | null;
  dropped: number;
  /** The events [lo, hi) at which these are every life there is (a kernel's answer); null:
   * a payload's, exact everywhere or at its checkpoints. */
  exact: [number, number] | null;
  /** The stacks and sites the lives' ids point to. */
  stacks: Frame[][];
  sites: string[];
}

export interface DecodedTimeline {
  /** Columns. */
  n: number;
  /** First event of each column. */
  index: Int32Array;
  timeUs: Float64Array;
  /** Highest allocated and reserved bytes of each column. */
  allocated: Float64Array;
  reserved: Float64Array;
  /** Lowest allocated and reserved bytes of each column. */
  allocatedMin: Float64Array;
  reservedMin: Float64Array;
  /** The event of each column's highest allocated bytes: where its bands are. */
  peakAt: Int32Array;
  bands: Float64Array[];
  bandLabels: string[];
  bandSites: number[];
  /** The events [i0, i1) the columns cover. */
  window: [number, number];
  /** Events in a full column: 1 when every event is drawn. */
  perColumn: number;
}

export interface Samples {
  n: number;
  t: Float64Array;
  allocated: Float64Array;
  reserved: Float64Array;
  device: Float64Array;
}

/** The payload with every column decoded; strings and lists as they came. */
export interface View {
  raw: ViewPayload;
  kind: ViewPayload['kind'];
  title: string;
  deviceName: string;
  nEvents: number;
  timeline: DecodedTimeline;
  lives: Lives;
  samples: Samples;
}

/**
 * Decode a lives dict (an empty one for a payload without lives); `names` are the payload's
 * stacks and sites, for lives that carry none of their own.
 */
export function decodeLives(
  p: Partial<LivesPayload> | undefined | null,
  names: { stacks?: Frame[][]; sites?: string[] } = {}
): Lives {
  const b = p?.blocks;
  const s = p?.segments;
  const blocks: BlockLives = {
    start: i32(b?.start),
    end: i32(b?.end),
    addr: f64(b?.addr),
    size: f64(b?.size),
    requested: f64(b?.requested),
    stack: i32(b?.stack),
    site: i32(b?.site),
    cell: i32(b?.cell),
    band: i32(b?.band),
    n: 0
  };
  blocks.n = blocks.start.length;
  const small = s?.small ? decodeColumn(s.small) : new Uint8Array(0);
  const segments: SegmentLives = {
    start: i32(s?.start),
    end: i32(s?.end),
    addr: f64(s?.addr),
    size: f64(s?.size),
    stream: f64(s?.stream),
    small: small instanceof Uint8Array ? small : Uint8Array.from(small),
    expandable: new Uint8Array(0),
    group: new Int32Array(0),
    range: new Float64Array(0),
    n: 0
  };
  segments.n = segments.start.length;
  // Older payloads have no expandable segments: every segment is classic.
  const exp = s?.expandable ? decodeColumn(s.expandable) : new Uint8Array(segments.n);
  segments.expandable = exp instanceof Uint8Array ? exp : Uint8Array.from(exp);
  segments.group = s?.group ? i32(s.group) : new Int32Array(segments.n).fill(-1);
  segments.range = s?.range ? f64(s.range) : new Float64Array(segments.n);
  for (const [name, arr] of Object.entries(blocks)) {
    const absent = name === 'band' && b?.band === undefined; // an older payload: bands by site
    if (typeof arr !== 'number' && arr.length !== blocks.n && !absent) {
      throw new TypeError(`lives.blocks.${name} has ${arr.length} rows, start has ${blocks.n}`);
    }
  }
  for (const [name, arr] of Object.entries(segments)) {
    if (typeof arr !== 'number' && arr.length !== segments.n) {
      throw new TypeError(`lives.segments.${name} has ${arr.length} rows, start has ${segments.n}`);
    }
  }
  const exact = p?.exact;
  return {
    blocks,
    segments,
    checkpoints: Array.isArray(p?.checkpoints) ? p!.checkpoints!.map(Number) : null,
    dropped: Number(p?.dropped ?? 0),
    exact: Array.isArray(exact) && exact.length === 2 ? [Number(exact[0]), Number(exact[1])] : null,
    stacks: Array.isArray(p?.stacks) ? p!.stacks! : (names.stacks ?? []),
    sites: Array.isArray(p?.sites) ? p!.sites!.map(String) : (names.sites ?? []).map(String)
  };
}

/** Live samples from n rows x 4 float64 (t_s, allocated, reserved, device_used; NaN unknown). */
export function decodeSamples(rows: Float64Array, want = Infinity): Samples {
  const n = Math.max(0, Math.min(want, Math.floor(rows.length / 4)));
  const out: Samples = {
    n,
    t: new Float64Array(n),
    allocated: new Float64Array(n),
    reserved: new Float64Array(n),
    device: new Float64Array(n)
  };
  for (let i = 0; i < n; i++) {
    out.t[i] = rows[4 * i];
    out.allocated[i] = rows[4 * i + 1];
    out.reserved[i] = rows[4 * i + 2];
    out.device[i] = rows[4 * i + 3];
  }
  return out;
}

/** Check the payload's shape and decode its columns. Throws TypeError on anything else. */
export function decodePayload(p: ViewPayload): View {
  if (!p || typeof p !== 'object') {
    throw new TypeError('the view payload is not an object');
  }
  if (p.schema !== 2) {
    throw new TypeError(`view payload schema ${JSON.stringify(p.schema)}, expected 2`);
  }
  const nEvents = Number(p.n_events ?? 0);
  const timeline = decodeTimeline(p.timeline ?? ({} as Partial<TimelinePayload>), nEvents);
  let samples = decodeSamples(new Float64Array(0));
  if (p.samples && p.samples.n > 0) {
    samples = decodeSamples(f64(p.samples.data), p.samples.n);
  }
  return {
    raw: p,
    kind: p.kind ?? 'trace',
    title: String(p.title ?? ''),
    deviceName: String(p.device_name ?? ''),
    nEvents,
    timeline,
    lives: decodeLives(p.lives, { stacks: p.stacks, sites: p.sites }),
    samples
  };
}

/**
 * Decode a timeline (a payload's, or a kernel's answer for a window) of a trace of `nEvents`
 * events; an older payload's points read as columns with no spread (min = max).
 */
export function decodeTimeline(t: Partial<TimelinePayload>, nEvents: number): DecodedTimeline {
  const index = i32(t.index);
  const n = index.length;
  const allocated = f64(t.allocated);
  const reserved = f64(t.reserved);
  const window: [number, number] = Array.isArray(t.window) ? [Number(t.window[0]), Number(t.window[1])] : [0, nEvents];
  const timeline: DecodedTimeline = {
    n,
    index,
    timeUs: f64(t.time_us),
    allocated,
    reserved,
    allocatedMin: t.allocated_min ? f64(t.allocated_min) : allocated,
    reservedMin: t.reserved_min ? f64(t.reserved_min) : reserved,
    peakAt: t.peak_at ? i32(t.peak_at) : index,
    bands: (t.bands ?? []).map(f64),
    bandLabels: (t.band_labels ?? []).map(String),
    bandSites: (t.band_sites ?? []).map(Number),
    window,
    perColumn: Number(t.per_column ?? (n >= window[1] - window[0] ? 1 : Math.ceil((window[1] - window[0]) / Math.max(n, 1))))
  };
  for (const arr of [timeline.timeUs, allocated, reserved, timeline.allocatedMin, timeline.reservedMin, timeline.peakAt, ...timeline.bands]) {
    if (arr.length !== n) {
      throw new TypeError(`a timeline column has ${arr.length} points, index has ${n}`);
    }
  }
  return timeline;
}
