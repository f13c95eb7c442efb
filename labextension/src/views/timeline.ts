// The timeline: allocated/reserved curves, stacked site bands, cell marks, the peak, OOMs;
// wheel zoom, drag-select, a brush strip, double-click or "reset zoom" to reset, click to pick.
// SVG; the series it draws is the finest known for its window (view.ts asks for finer).
import { formatCount } from '../format';
import type { DecodedTimeline, Samples, View } from '../payload';
import { bandAt, columnAt, nearestPoint } from '../pick';
import { clampDomain, linearScale, type LinearScale, zoomDomain } from '../scales';
import type { TickKind } from '../ticks';
import * as C from './colors';
import { clear, h, n2, s } from './dom';
import { followDrag } from './drag';
import { stepPath } from './paths';
import { drawAxes, drawLive, drawTrace } from './layers';
import { drawTimeMarks, type TimeMarks } from './timeMarks';

/**
 * What the timeline shows: a trace's events (drawn from `series`, the finest known for the
 * window, by default the saved one), or live samples over seconds.
 */
export type TimelineData =
  | { what: 'trace'; view: View; series?: DecodedTimeline }
  | { what: 'live'; samples: Samples; running?: boolean; marks?: TimeMarks };

/** Told the window [lo, hi] shown after each zoom, and the plot's width in pixels. */
export type ZoomListener = (lo: number, hi: number, px: number) => void;

export interface TimelineClick {
  /** The event (trace) under the click: its column's highest allocated one; the sample index for live. */
  k: number;
  /** The events [first, last] of the column clicked (a trace; one event when exact). */
  span: [number, number] | null;
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
/** Room kept above the highest curve (px): the peak label fits there, clear of every curve. */
const LABEL_ROOM = 16;

/** The stacked tops of a series' bands, bottom first. */
function stackBands(t: DecodedTimeline): Float64Array[] {
  const out: Float64Array[] = [];
  let below = new Float64Array(t.n);
  for (const b of t.bands) {
    const top = new Float64Array(t.n);
    for (let i = 0; i < t.n; i++) {
      top[i] = below[i] + b[i];
    }
    out.push(top);
    below = top;
  }
  return out;
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
  /** The top of the y axis drawn: the whole trace's, or a zoomed window's own. */
  private ytop = 1;
  private width = 760;
  private sx: LinearScale = linearScale([0, 1], [0, 1]);
  private sy: LinearScale = linearScale([0, 1], [0, 1]);
  private at = -1;
  /** Stops following the drag going on (brush or plot), if one is. */
  private stopDrag: (() => void) | null = null;
  /** Whether the last press on the plot became a drag (its click then picks nothing). */
  private dragged = false;
  readonly reset: HTMLButtonElement;

  constructor(
    private readonly onClick: (c: TimelineClick) => void,
    private readonly onZoom: ZoomListener = () => undefined
  ) {
    this.svg = s('svg', { class: 'gm-timeline', height: HEIGHT, role: 'img' });
    this.brush = s('svg', { class: 'gm-brush', height: BRUSH_H });
    this.legend = h('div', { class: 'gm-legend' });
    this.reset = h('button', { type: 'button', class: 'gm-reset', title: 'show the whole trace (or double-click the plot)' }, 'reset zoom');
    this.reset.hidden = true;
    this.reset.addEventListener('click', () => this.resetZoom());
    this.node = h('div', { class: 'gm-timeline-wrap' });
    this.node.append(this.svg, this.reset, this.brush, this.legend);
    this.svg.addEventListener('wheel', this.onWheel, { passive: false });
    this.svg.addEventListener('dblclick', () => this.resetZoom());
    this.svg.addEventListener('click', this.onSvgClick);
    this.svg.addEventListener('mousedown', this.onPlotDown);
    this.brush.addEventListener('mousedown', this.onBrushDown);
  }

  dispose(): void {
    this.stopDrag?.();
  }

  /** The series drawn now (a trace's), or null. */
  get series(): DecodedTimeline | null {
    return this.data?.what === 'trace' ? (this.data.series ?? this.data.view.timeline) : null;
  }

  /** Draw the trace from `series` (a finer one for the window shown), keeping the zoom. */
  setSeries(series: DecodedTimeline): void {
    if (this.data?.what !== 'trace' || this.series === series) {
      return;
    }
    this.data = { ...this.data, series };
    this.cum = stackBands(series);
    this.draw();
  }

  /** Width of the plot in px (what a column a pixel needs). */
  get plotWidth(): number {
    return Math.max(320, this.width) - PAD.l - PAD.r;
  }

  private zoomed(): void {
    this.reset.hidden = !(this.domain[0] > this.extent[0] || this.domain[1] < this.extent[1]);
    this.onZoom(this.domain[0], this.domain[1], this.plotWidth);
  }

  /** Show `data` (the zoom resets when what is shown changes kind or length). */
  setData(data: TimelineData | null): void {
    const before = this.data;
    this.data = data;
    this.cum = [];
    let extent: [number, number] = [0, 1];
    this.ymax = 1;
    if (data?.what === 'trace') {
      const t = data.view.timeline; // the y axis of the whole trace, whatever is drawn
      extent = [Math.min(0, t.n ? t.index[0] : 0), Math.max(1, data.view.nEvents - 1)];
      this.cum = stackBands(data.series ?? t);
      const below = stackBands(t).pop() ?? new Float64Array(t.n);
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
    this.reset.hidden = !(this.domain[0] > this.extent[0] || this.domain[1] < this.extent[1]);
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
    this.zoomed();
  }

  /** The x window shown now ([first, last] event or second). */
  get window(): [number, number] {
    return [...this.domain];
  }

  setWindow(lo: number, hi: number): void {
    this.domain = clampDomain(lo, hi, this.extent[0], this.extent[1], this.minSpan());
    this.draw();
    this.zoomed();
  }

  /**
   * The top of the y axis: the whole series' (ymax) unless a trace is zoomed in, then the
   * highest bytes in the window (with the same headroom), so a window far from the peak fills
   * the plot.
   */
  private shownTop(): number {
    const t = this.series;
    const zoomed = this.domain[0] > this.extent[0] || this.domain[1] < this.extent[1];
    if (!t || !zoomed || t.n === 0) {
      return this.ymax;
    }
    const top = this.cum.length ? this.cum[this.cum.length - 1] : null;
    let most = 0;
    for (let c = Math.max(0, columnAt(t.index, this.domain[0])); c < t.n && t.index[c] <= this.domain[1]; c++) {
      most = Math.max(most, t.allocated[c], t.reserved[c], top ? top[c] : 0);
    }
    if (most <= 0) {
      return this.ymax;
    }
    const plotH = this.height - PAD.t - PAD.b;
    return Math.min(this.ymax, most * Math.max(1.08, plotH / (plotH - LABEL_ROOM)));
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
    this.ytop = this.shownTop();
    this.sy = linearScale([0, this.ytop], [box.b, box.t]);
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
    drawAxes({ svg: this.svg, box, sx, sy, ytop: this.ytop, domain: this.domain, kind: this.kind() });
    const plot = s('g', { 'clip-path': `url(#${clipId})` });
    this.svg.append(plot);
    clear(this.legend);
    if (!data) {
      this.drawBrush();
      return;
    }
    if (data.what === 'live') {
      const marked = data.marks ? drawTimeMarks({ plot, svg: this.svg, box, sx, sy, samples: data.samples, marks: data.marks, domain: this.domain }) : null;
      const device = drawLive({ svg: this.svg, plot, samples: data.samples, running: data.running ?? false, sx, sy, box });
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
    drawTrace({ svg: this.svg, plot, view: v, series: this.series ?? v.timeline, cum: this.cum, sx, sy, box, domain: this.domain });
    const nb = this.cum.length;
    plot.append(s('line', { class: 'gm-cursor', x1: 0, x2: 0, y1: box.t, y2: box.b }));
    this.setAt(this.at);
    this.key(C.ALLOCATED, 'allocated');
    this.key(C.RESERVED, 'reserved');
    v.timeline.bandLabels.forEach((label, g) => this.key(C.bandColor(g, nb), label, true));
    if ((v.raw.n_ooms ?? 0) > 0) {
      this.key(C.RESERVED, `× OOM (${v.raw.n_ooms})`);
    }
    const per = this.series?.perColumn ?? 1;
    if (per > 1) {
      const sw = h('i', { class: 'gm-swatch gm-swatch-spread' });
      this.legend.append(h('span', { class: 'gm-key gm-spread-key' }, sw, `shade: lowest to highest in each column of ${formatCount(per)} events`));
    }
    this.drawBrush();
  }

  private key(color: string, label: string, band = false): void {
    const ink = color === C.ALLOCATED ? ' gm-swatch-allocated' : ''; // the theme's ink (CSS)
    const sw = h('i', { class: (band ? 'gm-swatch gm-swatch-band' : 'gm-swatch') + ink });
    sw.style.background = color;
    this.legend.append(h('span', { class: 'gm-key' }, sw, label));
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
    this.zoomed();
  };

  /** A drag over the plot selects a window to zoom to; a click without one picks. */
  private onPlotDown = (ev: MouseEvent): void => {
    const from = this.svgX(ev, this.svg);
    this.dragged = false;
    if (ev.button !== 0 || !this.data || from < PAD.l || from > Math.max(320, this.width) - PAD.r) {
      return;
    }
    ev.preventDefault();
    this.stopDrag?.();
    this.stopDrag = followDrag(
      e => this.selecting(from, this.plotX(e)),
      e => {
        this.svg.querySelector('rect.gm-select')?.remove();
        if (this.dragged) {
          const x = this.plotX(e);
          this.setWindow(this.sx.invert(Math.min(from, x)), this.sx.invert(Math.max(from, x)));
        }
      }
    );
  };

  private plotX(ev: MouseEvent): number {
    return Math.max(PAD.l, Math.min(Math.max(320, this.width) - PAD.r, this.svgX(ev, this.svg)));
  }

  /** Show the window a drag from `from` to `x` (px) selects, once it is a drag. */
  private selecting(from: number, x: number): void {
    if (!this.dragged && Math.abs(x - from) < 4) {
      return;
    }
    this.dragged = true;
    let rect = this.svg.querySelector('rect.gm-select');
    if (!rect) {
      rect = s('rect', { class: 'gm-select', y: PAD.t, height: this.height - PAD.t - PAD.b });
      this.svg.append(rect);
    }
    rect.setAttribute('x', n2(Math.min(x, from)));
    rect.setAttribute('width', n2(Math.abs(x - from)));
  }

  private brushValue(ev: MouseEvent): number {
    const w = Math.max(320, this.width);
    const bx = linearScale(this.extent, [PAD.l, w - PAD.r]);
    return Math.max(this.extent[0], Math.min(this.extent[1], bx.invert(this.svgX(ev, this.brush))));
  }

  /** A drag on the brush strip picks the window; a click there centres it. */
  private onBrushDown = (ev: MouseEvent): void => {
    if (!this.data) {
      return;
    }
    ev.preventDefault();
    const from = this.brushValue(ev);
    this.stopDrag?.();
    this.stopDrag = followDrag(
      e => {
        const v = this.brushValue(e);
        if (v !== from) {
          this.setWindow(Math.min(v, from), Math.max(v, from));
        }
      },
      e => {
        const v = this.brushValue(e);
        const span = this.domain[1] - this.domain[0];
        if (Math.abs(v - from) < (this.extent[1] - this.extent[0]) / 200) {
          this.setWindow(v - span / 2, v + span / 2);
        }
      }
    );
  };

  private onSvgClick = (ev: MouseEvent): void => {
    const d = this.data;
    if (!d || this.dragged) {
      this.dragged = false; // the click that ends a drag-select picks nothing
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
        this.onClick({ k: j, span: null, band: null, allocated: S.allocated[j], reserved: S.reserved[j] });
      }
      return;
    }
    const t = this.series ?? d.view.timeline;
    const j = t.perColumn > 1 ? columnAt(t.index, xv) : nearestPoint(t.index, xv);
    if (j < 0) {
      return;
    }
    const hit = bandAt(t, j, yv);
    const last = j + 1 < t.n ? t.index[j + 1] - 1 : t.window[1] - 1;
    this.onClick({
      k: t.peakAt[j],
      span: [t.index[j], Math.max(t.index[j], last)],
      band: hit ? { band: hit.band, offset: hit.offset, bytes: hit.top - hit.bottom } : null,
      allocated: t.allocated[j],
      reserved: t.reserved[j]
    });
  };
}
