// The live view of a cluster's workers: a heat strip (a row per worker, time to the right,
// colour = allocated or reserved as a fraction of the worker's device), row labels, the latest
// numbers at the right, a legend, a summary line and a hover tip. Text from data goes in only
// through textContent (h() and s()).
import {
  agoText,
  agoTicks,
  cellColor,
  columnX,
  F_OOMS,
  GONE_COLOR,
  heatColor,
  indexAt,
  NF,
  orderWorkers,
  rowLabel,
  rowLayout,
  rowNumbers,
  showsLabel,
  STALE_COLOR,
  summaryText,
  tipLines,
  type ColorBy,
  type RoundWindow,
  type WorkerInfo
} from '../cluster';
import { clear, h } from './dom';

const LABEL_W = 118;
const NUMS_W = 210;
const OOM_COLOR = '#d62728';

export class ClusterView {
  readonly node: HTMLDivElement;
  private readonly title: HTMLSpanElement;
  private readonly status: HTMLSpanElement;
  private readonly toggle: HTMLButtonElement;
  private readonly summary: HTMLDivElement;
  private readonly labels: HTMLDivElement;
  private readonly nums: HTMLDivElement;
  private readonly canvas: HTMLCanvasElement;
  private readonly axis: HTMLDivElement;
  private readonly legendBy: HTMLSpanElement;
  private readonly tip: HTMLDivElement;
  private readonly resizeObserver: ResizeObserver | null = null;
  private workers: WorkerInfo[] = [];
  private colorBy: ColorBy = 'allocated';
  private running = true;
  private interval = 1;

  constructor(
    parent: HTMLElement,
    private readonly window: RoundWindow
  ) {
    this.node = h('div', { class: 'gm-view gm-cluster', 'data-kind': 'cluster', 'data-rows': '0', 'data-rounds': '0' });
    this.title = h('span', { class: 'gm-title' });
    this.status = h('span', { class: 'gm-status gm-muted' });
    this.toggle = h('button', { type: 'button', class: 'gm-colorby', title: 'colour by allocated or reserved bytes' });
    this.toggle.addEventListener('click', () => this.setColorBy(this.colorBy === 'allocated' ? 'reserved' : 'allocated'));
    this.summary = h('div', { class: 'gm-csummary' });
    this.labels = h('div', { class: 'gm-clabels' });
    this.nums = h('div', { class: 'gm-cnums' });
    this.canvas = h('canvas', { class: 'gm-cheat' });
    this.axis = h('div', { class: 'gm-caxis' });
    this.tip = h('div', { class: 'gm-tip', role: 'tooltip' });
    this.tip.hidden = true;
    const bar = h('span', { class: 'gm-cbar' });
    bar.style.background = `linear-gradient(to right, ${[0, 0.25, 0.5, 0.75, 1].map(heatColor).join(', ')})`;
    this.legendBy = h('span', { class: 'gm-clegend-by' });
    const swatch = (color: string, text: string) => {
      const sw = h('span', { class: 'gm-swatch' });
      sw.style.background = color;
      return h('span', { class: 'gm-key' }, sw, text);
    };
    const oom = h('span', { class: 'gm-swatch gm-cswatch-oom' });
    oom.style.background = OOM_COLOR;
    const legend = h(
      'div',
      { class: 'gm-clegend' },
      this.legendBy,
      h('span', { class: 'gm-cbar-wrap' }, h('span', { class: 'gm-cbar-tick' }, '0%'), bar, h('span', { class: 'gm-cbar-tick' }, '100% of the device')),
      swatch(STALE_COLOR, 'no answer'),
      swatch(GONE_COLOR, 'gone'),
      h('span', { class: 'gm-key' }, oom, 'OOM'),
      h('span', { class: 'gm-key gm-muted' }, 'right: allocated / reserved / peak')
    );
    const strip = h('div', { class: 'gm-cstrip' }, this.labels, h('div', { class: 'gm-cmid' }, this.canvas, this.axis), this.nums);
    this.node.append(h('div', { class: 'gm-head' }, this.title, this.status, this.toggle), this.summary, legend, strip, this.tip);
    parent.append(this.node);
    this.canvas.addEventListener('mousemove', ev => this.hover(ev));
    this.canvas.addEventListener('mouseleave', () => {
      this.tip.hidden = true;
    });
    if (typeof ResizeObserver !== 'undefined') {
      this.resizeObserver = new ResizeObserver(() => this.draw());
      this.resizeObserver.observe(this.node);
    }
    this.setColorBy('allocated');
  }

  setTitle(text: string): void {
    this.title.textContent = text || 'Dask workers';
  }

  setRunning(running: boolean, interval: number): void {
    this.running = running;
    this.interval = interval;
    this.drawStatus();
  }

  setColorBy(by: ColorBy): void {
    this.colorBy = by;
    this.toggle.textContent = `colour: ${by}`;
    this.legendBy.textContent = `${by} bytes:`;
    this.node.dataset.colorBy = by;
    this.draw();
  }

  setWorkers(workers: WorkerInfo[]): void {
    this.workers = orderWorkers(workers);
    this.draw();
  }

  dispose(): void {
    this.resizeObserver?.disconnect();
    this.node.remove();
  }

  private drawStatus(): void {
    const n = this.window.length;
    const rate = this.interval > 0 ? `every ${this.interval} s` : '';
    this.status.textContent = `${this.running ? 'live' : 'stopped'} · ${n} sample${n === 1 ? '' : 's'} ${rate}`.trim();
  }

  /** Redraw everything from the window and the worker list. */
  draw(): void {
    const win = this.window;
    const n = this.workers.length;
    const layout = rowLayout(n);
    this.node.dataset.rows = String(n);
    this.node.dataset.rounds = String(win.length);
    this.drawStatus();
    const latest = (row: number) => win.latest(row);
    this.summary.textContent = n ? summaryText(this.workers, latest) : 'no workers yet';

    // labels and numbers: a div per row (thinned text when rows are thin)
    clear(this.labels);
    clear(this.nums);
    for (const [i, w] of this.workers.entries()) {
      const show = showsLabel(i, layout);
      const attrs = { class: 'gm-crow', 'data-state': w.state, 'data-row': w.row };
      const label = h('div', attrs, show ? rowLabel(w) : '');
      const num = h('div', { ...attrs, class: 'gm-cnum' }, show ? rowNumbers(w, latest(w.row)) : '');
      for (const el of [label, num]) {
        el.style.height = `${layout.rowH}px`;
        el.style.lineHeight = `${layout.rowH * (show ? layout.labelEvery : 1)}px`;
        el.style.fontSize = `${layout.fontPx}px`;
      }
      label.title = w.address;
      this.labels.append(label);
      this.nums.append(num);
    }

    // the strip
    const width = Math.max(120, (this.node.clientWidth || 900) - LABEL_W - NUMS_W - 16);
    const height = layout.height;
    const ratio = typeof devicePixelRatio === 'number' ? devicePixelRatio : 1;
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${height}px`;
    this.canvas.width = Math.round(width * ratio);
    this.canvas.height = Math.round(height * ratio);
    const ctx = this.canvas.getContext('2d');
    if (ctx) {
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      ctx.fillStyle = '#f4f4f4';
      ctx.fillRect(0, 0, width, height);
      const cap = win.capacity;
      const len = win.length;
      const at = new Map(this.workers.map((w, i) => [w.row, i]));
      const newest = len ? win.at(len - 1).index : 0;
      for (let j = 0; j < len; j++) {
        const r = win.at(j);
        const [x, cw] = columnX(r.index, width, cap, newest);
        if (x + cw <= 0) {
          continue;
        }
        const prev = j > 0 && win.at(j - 1).index === r.index - 1 ? win.at(j - 1) : null;
        for (let k = 0; k < r.rows.length; k++) {
          const i = at.get(r.rows[k]);
          if (i === undefined) {
            continue;
          }
          const w = this.workers[i];
          ctx.fillStyle = cellColor(win.cell(j, r.rows[k]), w.total, this.colorBy);
          ctx.fillRect(x, i * layout.rowH, Math.max(cw, 1) + 0.5, layout.rowH - (layout.rowH >= 10 ? 1 : 0));
          const ooms = r.values[k * NF + F_OOMS];
          const before = prev ? prev.values[prev.rows.indexOf(r.rows[k]) * NF + F_OOMS] : ooms;
          if (prev && prev.rows.indexOf(r.rows[k]) >= 0 && ooms > before) {
            ctx.fillStyle = OOM_COLOR;
            ctx.fillRect(x, i * layout.rowH, Math.max(2, cw), layout.rowH);
          }
        }
      }
    }

    // the time axis: seconds before the newest round
    clear(this.axis);
    this.axis.style.width = `${width}px`;
    const span = this.interval * win.capacity;
    for (const a of agoTicks(span)) {
      const tick = h('span', { class: 'gm-caxis-tick' }, agoText(a));
      const x = width * (1 - a / span);
      tick.style.left = `${Math.round(x)}px`;
      tick.style.transform = a === 0 ? 'translateX(-100%)' : x < 20 ? 'none' : 'translateX(-50%)';
      this.axis.append(tick);
    }
  }

  private hover(ev: MouseEvent): void {
    const rect = this.canvas.getBoundingClientRect();
    const x = ev.clientX - rect.left;
    const y = ev.clientY - rect.top;
    const layout = rowLayout(this.workers.length);
    const i = Math.floor(y / layout.rowH);
    const len = this.window.length;
    const index = len ? indexAt(x, rect.width, this.window.capacity, this.window.at(len - 1).index) : -1;
    const j = index < 0 ? -1 : this.window.find(index);
    const w = this.workers[i];
    if (!w || j < 0) {
      this.tip.hidden = true;
      return;
    }
    const r = this.window.at(j);
    const newest = this.window.at(this.window.length - 1).t;
    clear(this.tip);
    for (const line of tipLines(w, this.window.cell(j, w.row), r.t, newest - r.t)) {
      this.tip.append(h('div', {}, line));
    }
    this.tip.hidden = false;
    const host = this.node.getBoundingClientRect();
    const x0 = ev.clientX - host.left;
    const wide = this.tip.offsetWidth || 300;
    // to the left of the cursor where the right side has no room
    this.tip.style.left = `${Math.round(x0 + 14 + wide > host.width ? Math.max(0, x0 - 14 - wide) : x0 + 14)}px`;
    this.tip.style.top = `${Math.round(ev.clientY - host.top + 14)}px`;
  }
}
