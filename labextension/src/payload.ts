// The view payload (schema 2) and its decoding into typed arrays. No DOM.

/** Raw column data: binary (a widget buffer) or base64 text of the same little-endian bytes. */
export type ColumnData = DataView | ArrayBuffer | ArrayBufferView | string;

export interface Column {
  dtype: 'f8' | 'i4' | 'u1';
  data: ColumnData;
}

export type Frame = [filename: string, line: number, name: string];

export interface TimelinePayload {
  index: Column;
  time_us: Column;
  allocated: Column;
  reserved: Column;
  bands: Column[];
  band_labels: string[];
  /** What the bands are by: "site" (the top sites, then "other") or "holder". */
  bands_by?: 'site' | 'holder';
  /** Site bands: the site of each band but the last ("other"); holder bands: []. */
  band_sites: number[];
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
  /** `[address, names]` of the blocks live at the end that something is known to hold. */
  block_holders?: Array<[number, string[]]>;
  /** Only when the traced code raised: `ValueError: boom`. */
  raised?: string;
  samples: { n: number; data: Column } | null;
}

export type Typed = Float64Array | Int32Array | Uint8Array;

/** The bytes of `data`, copied into a fresh (so aligned) buffer. */
export function bytesOf(data: ColumnData | null | undefined): Uint8Array {
  if (data === null || data === undefined) {
    return new Uint8Array(0);
  }
  if (typeof data === 'string') {
    return base64Bytes(data);
  }
  if (data instanceof ArrayBuffer) {
    return new Uint8Array(data.slice(0));
  }
  if (ArrayBuffer.isView(data)) {
    return new Uint8Array(data.buffer, data.byteOffset, data.byteLength).slice();
  }
  throw new TypeError(`not column data: ${Object.prototype.toString.call(data)}`);
}

const B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
const B64_INDEX = (() => {
  const t = new Int16Array(128).fill(-1);
  for (let i = 0; i < B64.length; i++) {
    t[B64.charCodeAt(i)] = i;
  }
  t['-'.charCodeAt(0)] = 62; // the URL-safe alphabet too
  t['_'.charCodeAt(0)] = 63;
  return t;
})();

/** Decode base64 (standard or URL-safe, padding optional, whitespace ignored). */
export function base64Bytes(text: string): Uint8Array {
  const clean = text.replace(/[\s=]+/g, '');
  const out = new Uint8Array(Math.floor((clean.length * 3) / 4));
  let bits = 0;
  let acc = 0;
  let o = 0;
  for (let i = 0; i < clean.length; i++) {
    const c = clean.charCodeAt(i);
    const v = c < 128 ? B64_INDEX[c] : -1;
    if (v < 0) {
      throw new TypeError(`not base64: character ${JSON.stringify(clean[i])} at ${i}`);
    }
    acc = (acc << 6) | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[o++] = (acc >> bits) & 0xff;
    }
  }
  return out.subarray(0, o);
}

/** A column as its typed array (little-endian, as the payload stores it). */
export function decodeColumn(col: Column | null | undefined): Typed {
  if (!col) {
    return new Float64Array(0);
  }
  const bytes = bytesOf(col.data);
  switch (col.dtype) {
    case 'f8':
      return littleEndian(bytes, 8, (v, o) => v.getFloat64(o, true), Float64Array);
    case 'i4':
      return littleEndian(bytes, 4, (v, o) => v.getInt32(o, true), Int32Array);
    case 'u1':
      return bytes;
    default:
      throw new TypeError(`unknown column dtype ${JSON.stringify((col as Column).dtype)}`);
  }
}

const LITTLE = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

function littleEndian<T extends Float64Array | Int32Array>(
  bytes: Uint8Array,
  width: number,
  read: (v: DataView, o: number) => number,
  Ctor: { new (b: ArrayBuffer, o: number, n: number): T; new (n: number): T }
): T {
  if (bytes.byteLength % width !== 0) {
    throw new TypeError(`a column of ${bytes.byteLength} bytes is not whole ${width}-byte items`);
  }
  const n = bytes.byteLength / width;
  if (LITTLE) {
    return new Ctor(bytes.buffer as ArrayBuffer, bytes.byteOffset, n);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Ctor(n);
  for (let i = 0; i < n; i++) {
    out[i] = read(view, i * width);
  }
  return out;
}

export const f64 = (c: Column | null | undefined): Float64Array => toF64(decodeColumn(c));
export const i32 = (c: Column | null | undefined): Int32Array => toI32(decodeColumn(c));

function toF64(a: Typed): Float64Array {
  return a instanceof Float64Array ? a : Float64Array.from(a);
}
function toI32(a: Typed): Int32Array {
  return a instanceof Int32Array ? a : Int32Array.from(a);
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
}

export interface DecodedTimeline {
  n: number;
  index: Int32Array;
  timeUs: Float64Array;
  allocated: Float64Array;
  reserved: Float64Array;
  bands: Float64Array[];
  bandLabels: string[];
  bandSites: number[];
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

/** Decode a lives dict (an empty one for a payload without lives). */
export function decodeLives(p: Partial<LivesPayload> | undefined | null): Lives {
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
  return {
    blocks,
    segments,
    checkpoints: Array.isArray(p?.checkpoints) ? p!.checkpoints!.map(Number) : null,
    dropped: Number(p?.dropped ?? 0)
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
  const t = p.timeline ?? ({} as Partial<TimelinePayload>);
  const index = i32(t.index);
  const timeline: DecodedTimeline = {
    n: index.length,
    index,
    timeUs: f64(t.time_us),
    allocated: f64(t.allocated),
    reserved: f64(t.reserved),
    bands: (t.bands ?? []).map(f64),
    bandLabels: (t.band_labels ?? []).map(String),
    bandSites: (t.band_sites ?? []).map(Number)
  };
  for (const arr of [timeline.timeUs, timeline.allocated, timeline.reserved, ...timeline.bands]) {
    if (arr.length !== timeline.n) {
      throw new TypeError(`a timeline column has ${arr.length} points, index has ${timeline.n}`);
    }
  }
  let samples = decodeSamples(new Float64Array(0));
  if (p.samples && p.samples.n > 0) {
    samples = decodeSamples(f64(p.samples.data), p.samples.n);
  }
  return {
    raw: p,
    kind: p.kind ?? 'trace',
    title: String(p.title ?? ''),
    deviceName: String(p.device_name ?? ''),
    nEvents: Number(p.n_events ?? 0),
    timeline,
    lives: decodeLives(p.lives),
    samples
  };
}
