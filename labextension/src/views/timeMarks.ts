// Marks on a live series (the GPU memory panel's session): where each cell began, and the
// peak, drawn as the timeline draws a trace's (same classes, same label placement).
import { formatBytes } from '../format';
import { placeLabel, type Rect, stepMax } from '../labels';
import type { Samples } from '../payload';
import type { LinearScale } from '../scales';
import { n2, s } from './dom';

/** What to mark on a live series. */
export interface TimeMarks {
  /** Cells: where each began on the x axis, and its label (`[5]`). */
  cells: ReadonlyArray<readonly [x: number, label: string]>;
  /** Label the highest allocated sample (`peak 1.2 GiB`). */
  peak: boolean;
}

/** An 11px sans-serif character, and a bold one, are about this wide. */
const CHAR_W = 6.6;
const BOLD_CHAR_W = 7;

export interface TimeMarksRequest {
  /** The clipped plot group, and the SVG (for the peak's label, unclipped). */
  plot: SVGGElement;
  svg: SVGSVGElement;
  box: Rect;
  sx: LinearScale;
  sy: LinearScale;
  samples: Samples;
  marks: TimeMarks;
  /** The x window shown. */
  domain: readonly [number, number];
}

/** The highest allocated sample's index (the first such), -1 for none. */
export function peakSample(S: Samples): number {
  let best = -1;
  for (let i = 0; i < S.n; i++) {
    if (best < 0 || S.allocated[i] > S.allocated[best]) {
      best = i;
    }
  }
  return best;
}

/**
 * Draw `marks` on a live series, under its curves: a dashed line where each cell began
 * (`line.gm-cell`, with `data-x`), its label where it overlaps neither the label before nor the
 * peak's (`text.gm-cell-label`). Returns what draws the peak's mark and label over the curves
 * (`circle.gm-peak-mark`, `text.gm-peak-label`): call it once they are drawn.
 */
export function drawTimeMarks(req: TimeMarksRequest): () => void {
  const { plot, svg, box, sx, sy, samples: S, marks, domain } = req;
  let peakRect: Rect | null = null;
  let peak: { mark: SVGCircleElement; label: SVGTextElement } | null = null;
  const j = marks.peak ? peakSample(S) : -1;
  if (j >= 0 && S.allocated[j] > 0 && S.t[j] >= domain[0] && S.t[j] <= domain[1]) {
    const x = sx(S.t[j]);
    const y = sy(S.allocated[j]);
    const text = `peak ${formatBytes(S.allocated[j])}`;
    const ceiling = (x0: number, x1: number): number => {
      const lo = sx.invert(x0);
      const hi = sx.invert(x1);
      const top = Math.max(stepMax(S.t, S.allocated, S.n, lo, hi), stepMax(S.t, S.reserved, S.n, lo, hi));
      return top === -Infinity ? Infinity : sy(top);
    };
    const spot = placeLabel({ x, y, width: text.length * BOLD_CHAR_W, box, ceiling });
    peakRect = spot.rect;
    peak = {
      mark: s('circle', { class: 'gm-peak-mark', cx: n2(x), cy: n2(y), r: 3.5 }),
      label: s('text', { class: 'gm-peak-label gm-halo', x: n2(spot.x), y: n2(spot.y), 'text-anchor': spot.anchor }, text)
    };
  }
  let lastLabel = -Infinity;
  for (const [at, text] of marks.cells) {
    if (at < domain[0] || at > domain[1]) {
      continue;
    }
    const x = Math.round(sx(at)) + 0.5;
    plot.append(s('line', { class: 'gm-cell', 'data-x': at, x1: x, x2: x, y1: box.t, y2: box.b }));
    const w = text.length * CHAR_W;
    const under = peakRect !== null && x + 2 < peakRect.r && x + 2 + w > peakRect.l && peakRect.t < box.t + 12;
    if (x - lastLabel >= w + 6 && !under) {
      plot.append(s('text', { class: 'gm-cell-label gm-halo', x: x + 2, y: box.t + 9 }, text));
      lastLabel = x;
    }
  }
  return () => {
    if (peak) {
      plot.append(peak.mark);
      svg.append(peak.label);
    }
  };
}
