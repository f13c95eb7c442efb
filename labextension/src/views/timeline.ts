// The timeline: allocated/reserved curves, stacked site bands, cell marks, the peak, OOMs;
// wheel zoom, a brush strip, double-click to reset, click to pick. SVG.
import { formatBytes } from '../format';
import { placeLabel, type Rect, stepMax } from '../labels';
import type { Samples, View } from '../payload';
import { bandAt, nearestPoint } from '../pick';
import { clampDomain, linearScale, type LinearScale, zoomDomain } from '../scales';
import { axisTicks, rangeTicks, type TickKind } from '../ticks';
import * as C from './colors';
import { clear, h, n2, s } from './dom';
import { drawTimeMarks, type TimeMarks } from './timeMarks';

/** What the timeline shows: a trace's events, or live samples over seconds. */
export type TimelineData =
  | { what: 'trace'; view: View }
  | { what: 'live'; samples: Samples; running?: boolean; marks?: TimeMarks };

export interface TimelineClick {
  /** The event (trace) nearest the click; the sample index for live. */
  k: number;
  /** Band and bytes above its bottom under the click, if the click hit a band. */
  band: { band: number; offset: number; bytes: number } | null;
  allocated: number;
  reserved: number;
}

const HEIGHT = 230;
/** A live view is a mini view: shorter than a trace's timeline. */
const LIVE_HEIGHT = 150;
/** The y axis of a series that never leaves 0 B: 1 MiB, so its ticks read as sizes. */
export const EMPTY_YMAX = 1 << 20;
const BRUSH_H = 36;
const PAD = { l: 70, r: 14, t: 14, b: 24 };
/** An 11px sans-serif digit is about this wide. */
const CHAR_W = 6.6;
/** ... and in the bold of the peak label. */
const BOLD_CHAR_W = 7;
/** Room kept above the highest curve (px): the peak label fits there, clear of every curve. */
const LABEL_ROOM = 16;

interface Curve {
  x: ArrayLike<number>;
  y: ArrayLike<number>;
  n: number;
}

/** An SVG path of a step curve: the value holds from one point to the next. */
function stepPath(c: Curve, sx: LinearScale, sy: LinearScale): string {
  const parts: string[] = [];
  let open = false;
  for (let i = 0; i < c.n; i++) {
    const v = c.y[i];
    if (Number.isNaN(v)) {
      open = false;
      continue;
    }
    const x = n2(sx(c.x[i]));
    const y = n2(sy(v));
    if (!open) {
      parts.push(`M${x},${y}`);
      open = true;
    } else {
      parts.push(`H${x}V${y}`);
    }
  }
  return parts.join('');
}

/** A closed step area between `top` and `bottom` (null: zero). */
function stepArea(
  x: ArrayLike<number>,
  top: ArrayLike<number>,
  bottom: ArrayLike<number> | null,
  n: number,
  sx: LinearScale,
  sy: LinearScale
): string {
  if (n === 0) {
    return '';
  }
  const up: string[] = [`M${n2(sx(x[0]))},${n2(sy(bottom ? bottom[0] : 0))}`];
  for (let i = 0; i < n; i++) {
    if (i > 0) {
      up.push(`H${n2(sx(x[i]))}`);
    }
    up.push(`V${n2(sy(top[i]))}`);
  }
  // back along the bottom: the value at x[i-1] holds until x[i]
  up.push(`V${n2(sy(bottom ? bottom[n - 1] : 0))}`);
  for (let i = n - 1; i > 0; i--) {
    up.push(`V${n2(sy(bottom ? bottom[i - 1] : 0))}H${n2(sx(x[i - 1]))}`);
  }
  up.push('Z');
  return up.join('');
}

export class TimelineView {
  readonly node: HTMLDivElement;
  readonly svg: SVGSVGElement;
  readonly brush: SVGSVGElement;
  readonly legend: HTMLDivElement;
  private data: TimelineData | null = null;
  private cum: Float64Array[] = [];
  private domain: [number, number] = [0, 1];
  private extent: [number, number] = [0, 1];
  private ymax = 1;
  private width = 760;
  private sx: LinearScale = linearScale([0, 1], [0, 1]);
  private sy: LinearScale = linearScale([0, 1], [0, 1]);
  private at = -1;
  private dragFrom: number | null = null;

  constructor(
    private readonly onClick: (c: TimelineClick) => void
  ) {
    this.svg = s('svg', { class: 'gm-timeline', height: HEIGHT, role: 'img' });
    this.brush = s('svg', { class: 'gm-brush', height: BRUSH_H });
    this.legend = h('div', { class: 'gm-legend' });
    this.node = h('div', { class: 'gm-timeline-wrap' });
    this.node.append(this.svg, this.brush, this.legend);
    this.svg.addEventListener('wheel', this.onWheel, { passive: false });
    this.svg.addEventListener('dblclick', () => this.resetZoom());
    this.svg.addEventListener('click', this.onSvgClick);
    this.brush.addEventListener('mousedown', this.onBrushDown);
  }

  dispose(): void {
    window.removeEventListener('mousemove', this.onBrushMove);
    window.removeEventListener('mouseup', this.onBrushUp);
  }

  /** Show `data` (the zoom resets when what is shown changes kind or length). */
  setData(data: TimelineData | null): void {
    const before = this.data;
    this.data = data;
    this.cum = [];
    let extent: [number, number] = [0, 1];
    this.ymax = 1;
    if (data?.what === 'trace') {
      const t = data.view.timeline;
      extent = [Math.min(0, t.n ? t.index[0] : 0), Math.max(1, data.view.nEvents - 1)];
      let below = new Float64Array(t.n);
      for (const b of t.bands) {
        const top = new Float64Array(t.n);
        for (let i = 0; i < t.n; i++) {
          top[i] = below[i] + b[i];
        }
        this.cum.push(top);
        below = top;
      }
      const peak = data.view.raw.peak;
      this.ymax = Math.max(1, peak?.allocated ?? 0, peak?.reserved ?? 0);
      for (let i = 0; i < t.n; i++) {
        this.ymax = Math.max(this.ymax, t.allocated[i], t.reserved[i], below[i]);
      }
    } else if (data?.what === 'live') {
      const S = data.samples;
      // While samples arrive the axis starts at a second and grows; a finished series (a
      // short cell's few samples) spans its own time.
      const last = S.n ? S.t[S.n - 1] : 0;
      extent = data.running || !(last > 0) ? [0, Math.max(last, 1)] : [0, last];
      for (let i = 0; i < S.n; i++) {
        this.ymax = Math.max(this.ymax, S.allocated[i], S.reserved[i], Number.isNaN(S.device[i]) ? 0 : S.device[i]);
      }
    }
    if (this.ymax <= 1) {
      this.ymax = EMPTY_YMAX; // nothing allocated yet: an axis of sizes, not a lone "1 B"
    }
    // 8 % of headroom, and at least LABEL_ROOM px for the peak label
    const plotH = this.height - PAD.t - PAD.b;
    const labelled = data?.what === 'trace' || (data?.what === 'live' && data.marks?.peak);
    this.ymax *= labelled ? Math.max(1.08, plotH / (plotH - LABEL_ROOM)) : 1.08;
    const zoomed = this.domain[0] > this.extent[0] || this.domain[1] < this.extent[1];
    const sameKind = before?.what === data?.what;
    this.extent = extent;
    if (!(zoomed && sameKind)) {
      this.domain = [...extent];
    } else {
      // live data grows: keep the window, inside the new extent
      this.domain = clampDomain(this.domain[0], this.domain[1], extent[0], extent[1]);
    }
    this.draw();
  }

  /** Mark event k (the layout's event). */
  setAt(k: number): void {
    this.at = k;
    const cursor = this.svg.querySelector('.gm-cursor');
    if (cursor && this.data?.what === 'trace') {
      const x = n2(this.sx(Math.max(k, this.extent[0])));
      cursor.setAttribute('x1', x);
      cursor.setAttribute('x2', x);
      cursor.setAttribute('visibility', k >= this.domain[0] && k <= this.domain[1] ? 'visible' : 'hidden');
    }
  }

  resize(width: number): void {
    if (width > 0 && Math.abs(width - this.width) >= 1) {
      this.width = width;
      this.draw();
    }
  }

  resetZoom(): void {
    this.domain = [...this.extent];
    this.draw();
  }

  /** The x window shown now ([first, last] event or second). */
  get window(): [number, number] {
    return [...this.domain];
  }

  setWindow(lo: number, hi: number): void {
    this.domain = clampDomain(lo, hi, this.extent[0], this.extent[1], this.minSpan());
    this.draw();
  }

  /** Height of the drawing in px: a live mini view is shorter than a trace's timeline. */
  get height(): number {
    return this.data?.what === 'live' ? LIVE_HEIGHT : HEIGHT;
  }

  private minSpan(): number {
    return this.data?.what === 'trace' ? 2 : (this.extent[1] - this.extent[0]) / 1000;
  }

  private kind(): TickKind {
    return this.data?.what === 'live' ? 'seconds' : 'events';
  }

  draw(): void {
    const w = Math.max(320, this.width);
    this.svg.setAttribute('width', String(w));
    const height = this.height;
    this.svg.setAttribute('height', String(height));
    this.svg.setAttribute('viewBox', `0 0 ${w} ${height}`);
    clear(this.svg);
    const box = { l: PAD.l, r: w - PAD.r, t: PAD.t, b: height - PAD.b };
    this.sx = linearScale(this.domain, [box.l, box.r]);
    this.sy = linearScale([0, this.ymax], [box.b, box.t]);
    const sx = this.sx;
    const sy = this.sy;
    const data = this.data;
    this.svg.dataset.x0 = String(this.domain[0]);
    this.svg.dataset.x1 = String(this.domain[1]);
    const clipId = `gm-clip-${Math.random().toString(36).slice(2)}`;
    const defs = s('defs');
    const clip = s('clipPath', { id: clipId });
    clip.append(s('rect', { x: box.l, y: 0, width: box.r - box.l, height }));
    defs.append(clip);
    this.svg.append(defs);
    this.drawAxes(box);
    const plot = s('g', { 'clip-path': `url(#${clipId})` });
    this.svg.append(plot);
    clear(this.legend);
    if (!data) {
      this.drawBrush();
      return;
    }
    if (data.what === 'live') {
      const S = data.samples;
      this.svg.dataset.points = String(S.n);
      if (S.n === 0) {
        this.svg.append(s('text', { x: box.l + 10, y: box.t + 20, class: 'gm-empty' }, data.running ? 'waiting for samples…' : 'no samples were taken'));
      }
      const marked = data.marks ? drawTimeMarks({ plot, svg: this.svg, box, sx, sy, samples: S, marks: data.marks, domain: this.domain }) : null;
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
      marked?.();
      this.key(C.ALLOCATED, 'allocated');
      this.key(C.RESERVED, 'reserved');
      if (device) {
        this.key(C.DEVICE, 'device used (all processes)');
      }
      this.drawBrush();
      return;
    }
    const v = data.view;
    const t = v.timeline;
    this.svg.dataset.points = String(t.n);
    const nb = this.cum.length;
    for (let g = nb - 1; g >= 0; g--) {
      plot.append(
        s('path', {
          class: 'gm-band',
          'data-band': g,
          d: stepArea(t.index, this.cum[g], g > 0 ? this.cum[g - 1] : null, t.n, sx, sy),
          fill: C.bandColor(g, nb)
        })
      );
    }
    // the peak: its label beside the mark, above the curves under it (labels.ts)
    const peak = v.raw.peak;
    let peakMark: { mark: SVGCircleElement; label: SVGTextElement } | null = null;
    let peakRect: Rect | null = null;
    if (peak && peak.index >= 0 && peak.index >= this.domain[0] && peak.index <= this.domain[1]) {
      const x = sx(peak.index);
      const y = sy(peak.allocated);
      const text = `peak ${formatBytes(peak.allocated)} @ event ${peak.index}`;
      const curves = [t.reserved, t.allocated, ...(nb ? [this.cum[nb - 1]] : [])];
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
      if (i < this.domain[0] || i > this.domain[1]) {
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
    plot.append(
      s('path', { class: 'gm-curve gm-reserved', d: stepPath({ x: t.index, y: t.reserved, n: t.n }, sx, sy), stroke: C.RESERVED })
    );
    plot.append(
      s('path', { class: 'gm-curve gm-allocated', d: stepPath({ x: t.index, y: t.allocated, n: t.n }, sx, sy), stroke: C.ALLOCATED })
    );
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
      this.svg.append(peakMark.label);
    }
    plot.append(s('line', { class: 'gm-cursor', x1: 0, x2: 0, y1: box.t, y2: box.b }));
    this.setAt(this.at);
    this.key(C.ALLOCATED, 'allocated');
    this.key(C.RESERVED, 'reserved');
    t.bandLabels.forEach((label, g) => this.key(C.bandColor(g, nb), label, true));
    if ((v.raw.n_ooms ?? 0) > 0) {
      this.key(C.RESERVED, `× OOM (${v.raw.n_ooms})`);
    }
    this.drawBrush();
  }

  private key(color: string, label: string, band = false): void {
    const ink = color === C.ALLOCATED ? ' gm-swatch-allocated' : ''; // the theme's ink (CSS)
    const sw = h('i', { class: (band ? 'gm-swatch gm-swatch-band' : 'gm-swatch') + ink });
    sw.style.background = color;
    this.legend.append(h('span', { class: 'gm-key' }, sw, label));
  }

  private drawAxes(box: { l: number; r: number; t: number; b: number }): void {
    const g = s('g', { class: 'gm-axes' });
    for (const [y, label] of axisTicks(this.ymax, 'bytes')) {
      const yy = Math.round(this.sy(y)) + 0.5;
      g.append(s('line', { class: 'gm-grid', x1: box.l, x2: box.r, y1: yy, y2: yy }));
      g.append(s('text', { class: 'gm-ytick', x: box.l - 6, y: yy + 4, 'text-anchor': 'end' }, label));
    }
    const kind = this.kind();
    const ticks = rangeTicks(this.domain[0], this.domain[1], kind, 6);
    const unit = kind === 'seconds' ? 'seconds' : 'event';
    const unitX = box.r - unit.length * CHAR_W;
    let lastRight = -Infinity;
    for (const [x, label] of ticks) {
      const xx = this.sx(x);
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
    this.svg.append(g);
  }

  private drawBrush(): void {
    const w = Math.max(320, this.width);
    this.brush.setAttribute('width', String(w));
    this.brush.setAttribute('viewBox', `0 0 ${w} ${BRUSH_H}`);
    clear(this.brush);
    const bx = linearScale(this.extent, [PAD.l, w - PAD.r]);
    const by = linearScale([0, this.ymax], [BRUSH_H - 3, 3]);
    const d = this.data;
    if (d?.what === 'trace') {
      const t = d.view.timeline;
      this.brush.append(s('path', { class: 'gm-brush-curve', d: stepPath({ x: t.index, y: t.allocated, n: t.n }, bx, by) }));
    } else if (d?.what === 'live') {
      const S = d.samples;
      this.brush.append(s('path', { class: 'gm-brush-curve', d: stepPath({ x: S.t, y: S.allocated, n: S.n }, bx, by) }));
    }
    const x0 = bx(this.domain[0]);
    const x1 = bx(this.domain[1]);
    this.brush.append(
      s('rect', { class: 'gm-brush-window', x: n2(x0), y: 1, width: n2(Math.max(x1 - x0, 1)), height: BRUSH_H - 2 })
    );
    this.brush.dataset.x0 = String(this.domain[0]);
    this.brush.dataset.x1 = String(this.domain[1]);
  }

  private svgX(ev: MouseEvent, el: Element): number {
    const r = el.getBoundingClientRect();
    const w = Math.max(320, this.width);
    return ((ev.clientX - r.left) / Math.max(r.width, 1)) * w;
  }

  private onWheel = (ev: WheelEvent): void => {
    if (!this.data) {
      return;
    }
    ev.preventDefault();
    const at = this.sx.invert(this.svgX(ev, this.svg));
    const factor = Math.exp(Math.max(-1, Math.min(1, ev.deltaY / 300)));
    this.domain = zoomDomain(this.domain, at, factor, this.extent, this.minSpan());
    this.draw();
  };

  private brushValue(ev: MouseEvent): number {
    const w = Math.max(320, this.width);
    const bx = linearScale(this.extent, [PAD.l, w - PAD.r]);
    return Math.max(this.extent[0], Math.min(this.extent[1], bx.invert(this.svgX(ev, this.brush))));
  }

  private onBrushDown = (ev: MouseEvent): void => {
    if (!this.data) {
      return;
    }
    ev.preventDefault();
    this.dragFrom = this.brushValue(ev);
    window.addEventListener('mousemove', this.onBrushMove);
    window.addEventListener('mouseup', this.onBrushUp);
  };

  private onBrushMove = (ev: MouseEvent): void => {
    if (this.dragFrom === null) {
      return;
    }
    const v = this.brushValue(ev);
    if (Math.abs(v - this.dragFrom) > 0) {
      this.setWindow(Math.min(v, this.dragFrom), Math.max(v, this.dragFrom));
    }
  };

  private onBrushUp = (ev: MouseEvent): void => {
    if (this.dragFrom !== null) {
      const v = this.brushValue(ev);
      const span = this.domain[1] - this.domain[0];
      if (Math.abs(v - this.dragFrom) < (this.extent[1] - this.extent[0]) / 200) {
        // a click on the strip: centre the window there
        this.setWindow(v - span / 2, v + span / 2);
      }
    }
    this.dragFrom = null;
    window.removeEventListener('mousemove', this.onBrushMove);
    window.removeEventListener('mouseup', this.onBrushUp);
  };

  private onSvgClick = (ev: MouseEvent): void => {
    const d = this.data;
    if (!d) {
      return;
    }
    const r = this.svg.getBoundingClientRect();
    const w = Math.max(320, this.width);
    const x = ((ev.clientX - r.left) / Math.max(r.width, 1)) * w;
    const y = ((ev.clientY - r.top) / Math.max(r.height, 1)) * this.height;
    if (x < PAD.l || x > w - PAD.r) {
      return;
    }
    const xv = this.sx.invert(x);
    const yv = this.sy.invert(y);
    if (d.what === 'live') {
      const S = d.samples;
      const j = nearestPoint(S.t, xv);
      if (j >= 0) {
        this.onClick({ k: j, band: null, allocated: S.allocated[j], reserved: S.reserved[j] });
      }
      return;
    }
    const t = d.view.timeline;
    const j = nearestPoint(t.index, xv);
    if (j < 0) {
      return;
    }
    const hit = bandAt(t, j, yv);
    this.onClick({
      k: t.index[j],
      band: hit ? { band: hit.band, offset: hit.offset, bytes: hit.top - hit.bottom } : null,
      allocated: t.allocated[j],
      reserved: t.reserved[j]
    });
  };
}
