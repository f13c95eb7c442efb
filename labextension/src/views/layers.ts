// The timeline's layers: its axes; a trace's stacked bands, the spread and line of allocated
// and reserved bytes, cell marks, the peak and its label, OOM crosses; a live view's samples. SVG.
import { formatBytes, formatCount } from '../format';
import { placeLabel, type Rect, stepMax } from '../labels';
import type { DecodedTimeline, Samples, View } from '../payload';
import type { LinearScale } from '../scales';
import { axisTicks, rangeTicks, type TickKind } from '../ticks';
import * as C from './colors';
import { n2, s } from './dom';
import { stepArea, stepPath } from './paths';

/** An 11px sans-serif digit is about this wide. */
export const CHAR_W = 6.6;
/** ... and in the bold of the peak label. */
const BOLD_CHAR_W = 7;

type Box = { l: number; r: number; t: number; b: number };

/** The axes: byte ticks and grid up to `ytop`, event or second ticks over `domain`, the frame. */
export function drawAxes(a: { svg: SVGSVGElement; box: Box; sx: LinearScale; sy: LinearScale; ytop: number; domain: readonly [number, number]; kind: TickKind }): void {
  const { svg, box, sx, sy, domain, kind } = a;
  const g = s('g', { class: 'gm-axes' });
  for (const [y, label] of axisTicks(a.ytop, 'bytes')) {
    const yy = Math.round(sy(y)) + 0.5;
    g.append(s('line', { class: 'gm-grid', x1: box.l, x2: box.r, y1: yy, y2: yy }));
    g.append(s('text', { class: 'gm-ytick', x: box.l - 6, y: yy + 4, 'text-anchor': 'end' }, label));
  }
  const ticks = rangeTicks(domain[0], domain[1], kind, 6);
  const unit = kind === 'seconds' ? 'seconds' : 'event';
  const unitX = box.r - unit.length * CHAR_W;
  let lastRight = -Infinity;
  for (const [x, label] of ticks) {
    const xx = sx(x);
    const half = (label.length * CHAR_W) / 2;
    if (xx - half < lastRight + 8 || xx + half > unitX - 8) {
      continue;
    }
    g.append(s('line', { class: 'gm-xtick', x1: n2(xx), x2: n2(xx), y1: box.b, y2: box.b + 4 }));
    g.append(s('text', { class: 'gm-xtick-label', x: n2(xx), y: box.b + 16, 'text-anchor': 'middle' }, label));
    lastRight = xx + half;
  }
  g.append(s('text', { class: 'gm-axis-name', x: box.r, y: box.b + 16, 'text-anchor': 'end' }, unit));
  g.append(s('path', { class: 'gm-frame', d: `M${box.l + 0.5},${box.t}V${box.b + 0.5}H${box.r}` }));
  svg.append(g);
}

/** A live view's samples; whether the device's own reading is among them (drawn dashed). */
export function drawLive(l: { svg: SVGSVGElement; plot: SVGGElement; samples: Samples; running: boolean; sx: LinearScale; sy: LinearScale; box: Box }): boolean {
  const { svg, plot, samples: S, sx, sy, box } = l;
  svg.dataset.points = String(S.n);
  if (S.n === 0) {
    svg.append(s('text', { x: box.l + 10, y: box.t + 20, class: 'gm-empty' }, l.running ? 'waiting for samples…' : 'no samples were taken'));
  }
  // the device's own reading (every process's memory): only where the source gives one
  const device = Array.from(S.device.subarray(0, S.n)).some(v => !Number.isNaN(v));
  for (const [y, color, dashed, cls] of [
    ...(device ? ([[S.device, C.DEVICE, true, 'gm-device']] as const) : []),
    [S.reserved, C.RESERVED, false, 'gm-reserved'],
    [S.allocated, C.ALLOCATED, false, 'gm-allocated']
  ] as const) {
    plot.append(
      s('path', {
        class: `gm-curve ${cls}`,
        d: stepPath({ x: S.t, y, n: S.n }, sx, sy),
        stroke: color,
        'stroke-dasharray': dashed ? '4 3' : null
      })
    );
  }
  return device;
}

export interface TraceLayer {
  svg: SVGSVGElement;
  /** The clipped group the curves go in. */
  plot: SVGGElement;
  view: View;
  /** The series drawn (the saved one, or a finer one for the window). */
  series: DecodedTimeline;
  /** Its stacked band tops, bottom first. */
  cum: Float64Array[];
  sx: LinearScale;
  sy: LinearScale;
  box: Box;
  domain: readonly [number, number];
}

/** Draw a trace's series into `layer.plot` (the peak label over it, in `layer.svg`). */
export function drawTrace(layer: TraceLayer): void {
  const { svg, plot, view: v, series: t, cum, sx, sy, box, domain } = layer;
  const end = t.window[1] - 1; // the last column holds until its window's last event
  svg.dataset.points = String(t.n);
  svg.dataset.perColumn = String(t.perColumn);
  svg.dataset.series = `${t.window[0]},${t.window[1]}`;
  const nb = cum.length;
  for (let g = nb - 1; g >= 0; g--) {
    plot.append(
      s('path', {
        class: 'gm-band',
        'data-band': g,
        d: stepArea(t.index, cum[g], g > 0 ? cum[g - 1] : null, t.n, sx, sy, end),
        fill: C.bandColor(g, nb)
      })
    );
  }
  // the peak: its label beside the mark, above the curves under it (labels.ts)
  const peak = v.raw.peak;
  let peakMark: { mark: SVGCircleElement; label: SVGTextElement } | null = null;
  let peakRect: Rect | null = null;
  if (peak && peak.index >= 0 && peak.index >= domain[0] && peak.index <= domain[1]) {
    const x = sx(peak.index);
    const y = sy(peak.allocated);
    const text = `peak ${formatBytes(peak.allocated)} @ event ${formatCount(peak.index)}`;
    const curves = [t.reserved, t.allocated, ...(nb ? [cum[nb - 1]] : [])];
    const ceiling = (x0: number, x1: number): number => {
      const lo = sx.invert(x0);
      const hi = sx.invert(x1);
      const top = Math.max(...curves.map(c => stepMax(t.index, c, t.n, lo, hi)));
      return top === -Infinity ? Infinity : sy(top);
    };
    const spot = placeLabel({ x, y, width: text.length * BOLD_CHAR_W, box, ceiling });
    peakRect = spot.rect;
    peakMark = {
      mark: s('circle', { class: 'gm-peak-mark', cx: n2(x), cy: n2(y), r: 3.5 }),
      label: s('text', { class: 'gm-peak-label gm-halo', x: n2(spot.x), y: n2(spot.y), 'text-anchor': spot.anchor }, text)
    };
  }
  // cell marks, labels only where they overlap neither the one before nor the peak label
  let lastLabel = -Infinity;
  for (const [i, cell] of v.raw.cells ?? []) {
    if (i < domain[0] || i > domain[1]) {
      continue;
    }
    const x = Math.round(sx(i)) + 0.5;
    plot.append(s('line', { class: 'gm-cell', x1: x, x2: x, y1: box.t, y2: box.b }));
    const text = `[${cell}]`;
    const under = peakRect && x + 2 < peakRect.r && x + 2 + text.length * CHAR_W > peakRect.l && peakRect.t < box.t + 12;
    if (x - lastLabel >= text.length * CHAR_W + 6 && !under) {
      plot.append(s('text', { class: 'gm-cell-label gm-halo', x: x + 2, y: box.t + 9 }, text));
      lastLabel = x;
    }
  }
  // a column of many events: its lowest to highest bytes as a band, its highest as the line
  for (const [top, low, color, cls] of [
    [t.reserved, t.reservedMin, C.RESERVED, 'gm-reserved'],
    [t.allocated, t.allocatedMin, C.ALLOCATED, 'gm-allocated']
  ] as const) {
    if (t.perColumn > 1) {
      plot.append(s('path', { class: `gm-spread ${cls}`, d: stepArea(t.index, top, low, t.n, sx, sy, end), fill: color }));
    }
    plot.append(s('path', { class: `gm-curve ${cls}`, d: stepPath({ x: t.index, y: top, n: t.n }, sx, sy, end), stroke: color }));
  }
  // OOMs: a red cross at the bottom of the plot
  for (const k of v.raw.ooms ?? []) {
    const x = sx(k);
    const y = box.b - 6;
    plot.append(
      s('path', { class: 'gm-oom', d: `M${n2(x - 4)},${n2(y - 4)}L${n2(x + 4)},${n2(y + 4)}M${n2(x + 4)},${n2(y - 4)}L${n2(x - 4)},${n2(y + 4)}` })
    );
  }
  // over the curves, the label unclipped
  if (peakMark) {
    plot.append(peakMark.mark);
    svg.append(peakMark.label);
  }
}
