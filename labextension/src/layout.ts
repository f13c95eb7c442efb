// Row geometry of the block layout: one row per live segment (an expandable segment: one row
// for its mapped and unmapped ranges), its blocks to scale. No DOM.
import type { Lives } from './payload';
import { freeGaps, type LayoutAt, type RowAt, type SegmentAt, unmappedGaps } from './replay';

export interface BlockGeom {
  /** Block life index. */
  i: number;
  x: number;
  w: number;
  /** Width of the requested bytes from x; the rest of w is lost to rounding. */
  reqW: number;
}

export interface GapGeom {
  addr: number;
  size: number;
  x: number;
  w: number;
}

export interface PartGeom {
  seg: SegmentAt;
  x: number;
  w: number;
}

export interface RowGeom {
  row: RowAt;
  /** The row's first segment (a classic row's only one). */
  seg: SegmentAt;
  y: number;
  h: number;
  x: number;
  w: number;
  /** The live segments of the row (mapped ranges of an expandable one). */
  parts: PartGeom[];
  blocks: BlockGeom[];
  /** Cached free stretches (in the mapped ranges). */
  gaps: GapGeom[];
  /** Unmapped stretches of an expandable segment, up to its highest mapped end. */
  unmapped: GapGeom[];
  /** The rest of the reserved virtual range, not to scale: drawn in the last TAIL_PX. */
  tail: { x: number; w: number; bytes: number } | null;
}

export interface LayoutGeom {
  rows: RowGeom[];
  /** Whole drawing height in px. */
  height: number;
  /** Whether rows are tall enough to carry a text label. */
  labelled: boolean;
  /** The x where bars start (after the label column, if any). */
  barX: number;
  barW: number;
}

export interface LayoutOptions {
  /** Whole drawing width in px. */
  width: number;
  /** Label column width when rows are labelled (default 190). */
  labelWidth?: number;
  /** Tallest drawing in px before rows shrink (default 640). */
  maxHeight?: number;
}

/** Smallest width a block is drawn with, so that a tiny block is still visible. */
export const MIN_BLOCK_PX = 0.5;
/** Width of the mark for the part of an expandable segment's range past its highest mapped
 * end (tens of GiB on a large GPU: drawn to scale the mapped part would vanish). */
export const TAIL_PX = 96;

/** Narrowest a segment's row is drawn, so that the blocks of a small one can still be seen. */
export const MIN_ROW_PX = 48;

/**
 * Rows of 14 px with 3 px between while they fit in `maxHeight`, else thinner rows (at least
 * 2 px, no gap, no label). Rows are to scale: the largest segment spans the bar, the others
 * their share of it (at least MIN_ROW_PX); a block sits at (addr - row addr) / row size of its
 * row. An expandable segment's row spans its known range (``RowAt``) and, when the range it
 * reserves is larger, ends in a TAIL_PX mark for the rest (then every row's scale leaves
 * room for that mark).
 */
export function layoutGeometry(lives: Lives, at: LayoutAt, opts: LayoutOptions): LayoutGeom {
  const n = at.rows.length;
  const maxHeight = opts.maxHeight ?? 640;
  let rowH = 14;
  let gap = 3;
  if (n * (rowH + gap) > maxHeight) {
    gap = n * 9 <= maxHeight ? 1 : 0;
    rowH = Math.max(2, Math.floor(maxHeight / Math.max(n, 1)) - gap);
  }
  const labelled = rowH >= 10;
  const barX = labelled ? (opts.labelWidth ?? 190) : 8;
  const barW = Math.max(10, opts.width - barX - 4);
  const B = lives.blocks;
  const tails = at.rows.some(row => row.expandable && row.range > row.size);
  const span = tails ? Math.max(barW - TAIL_PX, barW / 2) : barW;
  const largest = at.rows.reduce((m, row) => Math.max(m, row.size), 0);
  const rows: RowGeom[] = at.rows.map((row, r) => {
    const rest = row.expandable ? Math.max(row.range - row.size, 0) : 0;
    const scaleW = largest > 0 ? Math.min(span, Math.max(MIN_ROW_PX, (row.size / largest) * span)) : span;
    const px = (bytes: number) => (row.size > 0 ? (bytes / row.size) * scaleW : 0);
    const parts = row.parts.map(seg => ({ seg, x: barX + px(seg.addr - row.addr), w: px(seg.size) }));
    const blocks = row.parts.flatMap(seg =>
      seg.blocks.map(i => {
        const w = Math.max(px(B.size[i]), MIN_BLOCK_PX);
        return {
          i,
          x: barX + px(B.addr[i] - row.addr),
          w,
          reqW: Math.min(px(Math.min(B.requested[i], B.size[i])), w)
        };
      })
    );
    const gaps = row.parts.flatMap(seg =>
      freeGaps(lives, seg).map(g => ({ ...g, x: barX + px(g.addr - row.addr), w: px(g.size) }))
    );
    const unmapped = unmappedGaps(row).map(g => ({ ...g, x: barX + px(g.addr - row.addr), w: px(g.size) }));
    const tail = rest > 0 ? { x: barX + scaleW, w: barW - span, bytes: rest } : null;
    const w = scaleW + (tail ? tail.w : 0);
    return { row, seg: row.parts[0], y: r * (rowH + gap), h: rowH, x: barX, w, parts, blocks, gaps, unmapped, tail };
  });
  return { rows, height: Math.max(n * (rowH + gap), rowH), labelled, barX, barW };
}

/** The label of a row: `0x… 20 MiB large s0`, or `expandable large s0 · 60 MiB mapped`. */
export function rowLabel(row: RowAt, fmt: (n: number) => string, hexOf: (n: number) => string): string {
  const pool = row.small ? 'small' : 'large';
  if (!row.expandable) {
    return `${hexOf(row.addr)} ${fmt(row.size)} ${pool} s${row.stream}`;
  }
  return `expandable ${pool} s${row.stream} · ${fmt(row.mapped)} mapped`;
}

/** One line on an expandable row: what is mapped of what it reserves, and what is drawn. */
export function expandableSummary(row: RowAt, fmt: (n: number) => string): string {
  const pool = row.small ? 'small' : 'large';
  const of = row.range > 0 ? ` of a ${fmt(row.range)} reserved range` : '';
  return `expandable segment · ${pool} pool · stream ${row.stream} · ${fmt(row.mapped)} mapped${of}; drawn up to its highest mapped page (${fmt(row.size)})`;
}

/** The tooltip lines of an unmapped stretch of an expandable row (`tail`: past the drawn span). */
export function unmappedTip(row: RowAt, gap: { addr: number; size: number }, tail: boolean, fmt: (n: number) => string, hexOf: (n: number) => string): [string, string] {
  const pool = row.small ? 'small' : 'large';
  if (tail) {
    return [
      `unmapped · ${fmt(gap.size)}: the rest of the reserved range (not to scale)`,
      `${fmt(row.mapped)} mapped of ${fmt(row.range)} · expandable ${pool}-pool segment, stream ${row.stream}`
    ];
  }
  return [
    `unmapped · ${fmt(gap.size)} at ${hexOf(gap.addr)}`,
    `reserved address space with no memory behind it · expandable ${pool}-pool segment, stream ${row.stream}`
  ];
}
