// Small hand-made lives and payloads for the tests.
import type { Column, Lives, ViewPayload } from '../src/payload';
import { decodeLives } from '../src/payload';

export const MiB = 1024 * 1024;

function b64(bytes: Uint8Array): string {
  return Buffer.from(bytes).toString('base64');
}

export function col(dtype: 'f8' | 'i4' | 'u1', values: number[], as: 'base64' | 'binary' = 'binary'): Column {
  const arr = dtype === 'f8' ? new Float64Array(values) : dtype === 'i4' ? new Int32Array(values) : new Uint8Array(values);
  const bytes = new Uint8Array(arr.buffer);
  return { dtype, data: as === 'base64' ? b64(bytes) : new DataView(bytes.buffer) };
}

export interface BlockRow {
  start: number;
  end: number;
  addr: number;
  size: number;
  requested?: number;
  stack?: number;
  site?: number;
  cell?: number;
  band?: number;
}

export interface SegRow {
  start: number;
  end: number;
  addr: number;
  size: number;
  stream?: number;
  small?: boolean;
  /** An expandable segment's mapped range: its group (row) id. */
  group?: number;
  /** The virtual bytes its expandable segment reserves. */
  range?: number;
}

export function livesPayload(blocks: BlockRow[], segs: SegRow[], as: 'base64' | 'binary' = 'binary', checkpoints: number[] | null = null) {
  return {
    blocks: {
      start: col('i4', blocks.map(b => b.start), as),
      end: col('i4', blocks.map(b => b.end), as),
      addr: col('f8', blocks.map(b => b.addr), as),
      size: col('f8', blocks.map(b => b.size), as),
      requested: col('f8', blocks.map(b => b.requested ?? b.size), as),
      stack: col('i4', blocks.map(b => b.stack ?? -1), as),
      site: col('i4', blocks.map(b => b.site ?? -1), as),
      cell: col('i4', blocks.map(b => b.cell ?? -1), as),
      ...(blocks.some(b => b.band !== undefined) ? { band: col('i4', blocks.map(b => b.band ?? -1), as) } : {})
    },
    segments: {
      start: col('i4', segs.map(s => s.start), as),
      end: col('i4', segs.map(s => s.end), as),
      addr: col('f8', segs.map(s => s.addr), as),
      size: col('f8', segs.map(s => s.size), as),
      stream: col('f8', segs.map(s => s.stream ?? 0), as),
      small: col('u1', segs.map(s => (s.small ? 1 : 0)), as),
      ...(segs.some(s => s.group !== undefined)
        ? {
            expandable: col('u1', segs.map(s => (s.group !== undefined ? 1 : 0)), as),
            group: col('i4', segs.map(s => s.group ?? -1), as),
            range: col('f8', segs.map(s => s.range ?? 0), as)
          }
        : {})
    },
    checkpoints,
    dropped: 0
  };
}

export function lives(blocks: BlockRow[], segs: SegRow[], checkpoints: number[] | null = null): Lives {
  return decodeLives(livesPayload(blocks, segs, 'binary', checkpoints));
}

/**
 * A trace of 6 events on one 20 MiB segment at 0x1000000 (made at event 0):
 * 1: A 4 MiB (site 0) at +0, 2: B 2 MiB (site 1) at +4 MiB, requested 1.5 MiB,
 * 3: C 6 MiB (site 0) at +6 MiB, 4: free A, 5: D 1 MiB (site 1) at +0.
 * A block B0 of 1 MiB older than the trace lives in a second 2 MiB small segment.
 */
export const BASE = 0x1000000;
export const SMALL_BASE = 0x4000000;
export const TRACE_BLOCKS: BlockRow[] = [
  { start: 1, end: 4, addr: BASE, size: 4 * MiB, site: 0, stack: 0, cell: 5 },
  { start: 2, end: 6, addr: BASE + 4 * MiB, size: 2 * MiB, requested: 1.5 * MiB, site: 1, stack: 1, cell: 5 },
  { start: 3, end: 6, addr: BASE + 6 * MiB, size: 6 * MiB, site: 0, stack: 0, cell: 6 },
  { start: 5, end: 6, addr: BASE, size: 1 * MiB, site: 1, stack: 1, cell: 6 },
  { start: -1, end: 6, addr: SMALL_BASE, size: 1 * MiB }
];
export const TRACE_SEGS: SegRow[] = [
  { start: 0, end: 6, addr: BASE, size: 20 * MiB },
  { start: -1, end: 6, addr: SMALL_BASE, size: 2 * MiB, small: true, stream: 7 }
];

export function tracePayload(as: 'base64' | 'binary' = 'base64'): ViewPayload {
  // bytes live per band after events 0..5: site 0, site 1, other (the old block)
  const site0 = [0, 4, 4, 10, 6, 6].map(v => v * MiB);
  const site1 = [0, 0, 2, 2, 2, 3].map(v => v * MiB);
  const other = [1, 1, 1, 1, 1, 1].map(v => v * MiB);
  const allocated = site0.map((v, i) => v + site1[i] + other[i]);
  const reserved = [22, 22, 22, 22, 22, 22].map(v => v * MiB);
  return {
    schema: 2,
    kind: 'trace',
    title: 'test <b>trace</b>',
    device: 0,
    device_name: 'Simulated GPU',
    n_events: 6,
    start_allocated: MiB,
    start_reserved: 2 * MiB,
    timeline: {
      index: col('i4', [0, 1, 2, 3, 4, 5], as),
      time_us: col('f8', [0, 1, 2, 3, 4, 5], as),
      allocated: col('f8', allocated, as),
      reserved: col('f8', reserved, as),
      bands: [col('f8', site0, as), col('f8', site1, as), col('f8', other, as)],
      band_labels: ['cell [5] line 1', 'cell [5] line 2', 'other'],
      band_sites: [0, 1]
    },
    peak: { index: 3, allocated: 13 * MiB, reserved: 22 * MiB },
    ooms: [],
    n_ooms: 0,
    cells: [
      [1, 5],
      [3, 6]
    ],
    lives: livesPayload(TRACE_BLOCKS, TRACE_SEGS, as),
    stacks: [
      [['<script>x.py', 1, 'f']],
      [['cell.py', 2, '<module>']]
    ],
    sites: ['cell [5] line 1', 'cell [5] line 2'],
    top_sites: [{ site: 'cell [5] line 1', bytes: 10 * MiB, count: 2 }],
    surviving: [{ address: BASE, size: MiB, requested: MiB, site: 'cell [5] line 2', holders: ['x'], stack: 1 }],
    samples: null
  };
}
