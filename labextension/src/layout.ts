// Row geometry of the block layout: one row per live segment, its blocks to scale. No DOM.
import type { Lives } from './payload';
import { freeGaps, type LayoutAt, type SegmentAt } from './replay';

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

export interface RowGeom {
  seg: SegmentAt;
  y: number;
  h: number;
  x: number;
  w: number;
  blocks: BlockGeom[];
  gaps: GapGeom[];
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

/**
 * Rows of 14 px with 3 px between while they fit in `maxHeight`, else thinner rows (at least
 * 2 px, no gap, no label). Each row spans the bar width; a block sits at (addr - segment addr)
 * / segment size of it.
 */
export function layoutGeometry(lives: Lives, at: LayoutAt, opts: LayoutOptions): LayoutGeom {
  const n = at.segments.length;
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
  const rows: RowGeom[] = at.segments.map((seg, r) => {
    const px = (bytes: number) => (seg.size > 0 ? (bytes / seg.size) * barW : 0);
    const blocks = seg.blocks.map(i => {
      const w = Math.max(px(B.size[i]), MIN_BLOCK_PX);
      return {
        i,
        x: barX + px(B.addr[i] - seg.addr),
        w,
        reqW: Math.min(px(Math.min(B.requested[i], B.size[i])), w)
      };
    });
    const gaps = freeGaps(lives, seg).map(g => ({
      ...g,
      x: barX + px(g.addr - seg.addr),
      w: px(g.size)
    }));
    return { seg, y: r * (rowH + gap), h: rowH, x: barX, w: barW, blocks, gaps };
  });
  return { rows, height: Math.max(n * (rowH + gap), rowH), labelled, barX, barW };
}
