// Where a floating label goes on a plot (the timeline's peak label): beside its mark, above the
// curves under it, inside the plot box. Pixels, SVG's y down. No DOM.

/** A rectangle in px: left, right, top, bottom (t < b). */
export interface Rect {
  l: number;
  r: number;
  t: number;
  b: number;
}

export interface LabelRequest {
  /** The mark the label names (its centre, px). */
  x: number;
  y: number;
  /** The label's width estimate (px). */
  width: number;
  /** The plot box the label stays inside. */
  box: Rect;
  /** Text above and below the baseline (px; default 9 and 3, an 11px font). */
  ascent?: number;
  descent?: number;
  /** Room between the label and the mark, sideways (px; default 6). */
  gap?: number;
  /** Room between the label and a curve (px; default 3). */
  pad?: number;
  /** The mark's radius (px; default 3.5). */
  markR?: number;
  /**
   * The topmost px y that a curve reaches over [x0, x1] (Infinity where none is drawn);
   * absent: no curves to avoid.
   */
  ceiling?: (x0: number, x1: number) => number;
}

export interface LabelSpot {
  /** Where an SVG `text` goes: its anchor point and baseline. */
  x: number;
  y: number;
  anchor: 'start' | 'end';
  /** The label's box (px), from the estimates. */
  rect: Rect;
  /** False where no spot was clear of the curves: the label sits at the top of the box. */
  clear: boolean;
}

/**
 * A spot for a label that names the mark at (x, y). Tried in turn: beside the mark on the roomier
 * side (right of a mark in the left half of the box, else left), then the other side, then
 * centred over the mark; each needs the label whole inside the box horizontally. A spot's
 * baseline is as low as it may be: the label's bottom no lower than the mark's centre (beside it)
 * or its top less `pad` (over it), and `pad` above every curve under the label or within `pad`
 * of its ends (`ceiling`). The first spot whose top is still inside the box
 * wins. Where none is, the first spot that fits sideways goes to the top of the box, `clear`
 * false (its text halo keeps it readable over a line).
 */
export function placeLabel(req: LabelRequest): LabelSpot {
  const { x, y, width: w, box } = req;
  const ascent = req.ascent ?? 9;
  const descent = req.descent ?? 3;
  const gap = req.gap ?? 6;
  const pad = req.pad ?? 3;
  const markR = req.markR ?? 3.5;
  const rightFirst = x < (box.l + box.r) / 2;
  const spans: { l: number; r: number; anchor: 'start' | 'end'; over: boolean }[] = [];
  for (const right of [rightFirst, !rightFirst]) {
    spans.push(right ? { l: x + gap, r: x + gap + w, anchor: 'start', over: false } : { l: x - gap - w, r: x - gap, anchor: 'end', over: false });
  }
  const centred = Math.min(Math.max(x - w / 2, box.l), Math.max(box.r - w, box.l));
  spans.push({ l: centred, r: centred + w, anchor: 'start', over: true });
  const fitting = spans.filter(sp => sp.l >= box.l && sp.r <= box.r);
  const spot = (sp: { l: number; r: number; anchor: 'start' | 'end' }, baseline: number, clear: boolean): LabelSpot => ({
    x: sp.anchor === 'end' ? sp.r : sp.l,
    y: baseline,
    anchor: sp.anchor,
    rect: { l: sp.l, r: sp.r, t: baseline - ascent, b: baseline + descent },
    clear
  });
  for (const sp of fitting) {
    let bottom = sp.over ? y - markR - pad : y;
    if (req.ceiling) {
      bottom = Math.min(bottom, req.ceiling(sp.l - pad, sp.r + pad) - pad);
    }
    if (bottom - descent - ascent >= box.t) {
      return spot(sp, bottom - descent, true);
    }
  }
  const sp = fitting.length ? fitting[0] : { l: box.l, r: box.l + w, anchor: 'start' as const };
  return spot(sp, box.t + ascent, false);
}

/**
 * The highest value a step curve reaches over x in [lo, hi], as drawn: y[i] holds from x[i] to
 * x[i+1] (the last point only at x[n-1]), and the riser at x[i+1] joins y[i] to y[i+1]. NaN
 * points are gaps. -Infinity where the curve draws nothing there.
 */
export function stepMax(x: ArrayLike<number>, y: ArrayLike<number>, n: number, lo: number, hi: number): number {
  let top = -Infinity;
  for (let i = 0; i < n; i++) {
    const end = i + 1 < n ? x[i + 1] : x[i];
    if (x[i] <= hi && end >= lo && !Number.isNaN(y[i])) {
      top = Math.max(top, y[i]);
    }
  }
  return top;
}
