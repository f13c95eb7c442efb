// The whole memory view: head, timeline (+ brush), controls, block layout, tables, tooltip.
// Every entry (widget, MIME renderer, offline page) draws through this class.
import { DetailAsker } from '../asker';
import type { DetailSource } from '../detail';
import { formatBytes, formatCount, hex } from '../format';
import { decodeSamples, type Lives, type Samples, type View } from '../payload';
import { pickBlock } from '../pick';
import { endIndex, peakIndex } from '../replay';
import { BlocksView, stackNode } from './blocks';
import { clear, h } from './dom';
import { sitesTable, survivingTable } from './tables';
import { TimelineView, type TimelineClick } from './timeline';

type Tab = 'trace' | 'live';

export class MemoryView {
  readonly node: HTMLDivElement;
  private readonly title: HTMLSpanElement;
  private readonly info: HTMLSpanElement;
  private readonly status: HTMLSpanElement;
  private readonly raised: HTMLDivElement;
  private readonly tabs: HTMLSpanElement;
  private readonly timeline: TimelineView;
  /** What the timeline says of its detail: coarse here, loading. */
  private readonly note: HTMLDivElement;
  private readonly pickInfo: HTMLDivElement;
  private readonly controls: HTMLDivElement;
  private readonly slider: HTMLInputElement;
  private readonly atText: HTMLSpanElement;
  /** Where the layout shown is not the one asked for: why, and where every event is. */
  private readonly layoutInfo: HTMLDivElement;
  private readonly blocks: BlocksView;
  private readonly tables: HTMLDivElement;
  private readonly tip: HTMLDivElement;
  private readonly resizeObserver: ResizeObserver | null = null;
  private view: View | null = null;
  private samples: Samples = decodeSamples(new Float64Array(0));
  private live = false;
  private tab: Tab = 'trace';
  private k = -1;
  /** Where detail comes from (a widget's kernel), or null: the saved view alone. */
  private detail: DetailSource | null = null;
  /** What to draw at each zoom and event, and when to ask the kernel (a trace's). */
  private asker: DetailAsker | null = null;
  /** A click on the timeline waiting for the layout at its event. */
  private pending: TimelineClick | null = null;

  constructor(parent: HTMLElement) {
    this.node = h('div', { class: 'gm-view', 'data-kind': 'trace', 'data-at': '-1', 'data-blocks': '0', 'data-segments': '0' });
    this.title = h('span', { class: 'gm-title' });
    this.info = h('span', { class: 'gm-info gm-muted' });
    this.status = h('span', { class: 'gm-status gm-muted' });
    this.raised = h('div', { class: 'gm-raised', role: 'note' });
    this.raised.hidden = true;
    this.tabs = h(
      'span',
      { class: 'gm-tabs' },
      h('button', { type: 'button', 'data-tab': 'trace' }, 'trace'),
      h('button', { type: 'button', 'data-tab': 'live' }, 'live samples')
    );
    this.tabs.addEventListener('click', ev => {
      const tab = (ev.target as HTMLElement | null)?.getAttribute('data-tab');
      if (tab === 'trace' || tab === 'live') {
        this.tab = tab;
        this.refresh();
      }
    });
    this.tip = h('div', { class: 'gm-tip', role: 'tooltip' });
    this.tip.hidden = true;
    this.timeline = new TimelineView(
      c => this.onTimelineClick(c),
      (lo, hi, px) => this.asker?.zoomed(lo, hi, px)
    );
    this.note = h('div', { class: 'gm-note gm-muted' });
    this.note.hidden = true;
    this.pickInfo = h('div', { class: 'gm-pick gm-muted' }, 'Click the timeline to see the layout after that event and the allocation under the cursor.');
    const peak = h('button', { type: 'button', class: 'gm-peak' }, 'peak');
    const end = h('button', { type: 'button', class: 'gm-end' }, 'end');
    this.slider = h('input', { type: 'range', class: 'gm-slider', min: -1, max: 0, step: 1, value: 0, 'aria-label': 'event' });
    this.atText = h('span', { class: 'gm-at' });
    peak.addEventListener('click', () => this.setAt(peakIndex(this.view?.raw.peak, this.view?.nEvents ?? 0)));
    end.addEventListener('click', () => this.setAt(endIndex(this.view?.nEvents ?? 0)));
    this.slider.addEventListener('input', () => this.setAt(Number(this.slider.value)));
    this.controls = h('div', { class: 'gm-controls' }, peak, end, this.slider, this.atText);
    this.layoutInfo = h('div', { class: 'gm-layout-note gm-muted' });
    this.layoutInfo.hidden = true;
    this.blocks = new BlocksView(this.tip, this.node);
    this.tables = h('div', { class: 'gm-tables' });
    this.node.append(
      h('div', { class: 'gm-head' }, this.title, this.tabs, this.info, this.status),
      this.raised,
      this.timeline.node,
      this.note,
      this.pickInfo,
      this.controls,
      this.layoutInfo,
      this.blocks.node,
      this.tables,
      this.tip
    );
    parent.append(this.node);
    if (typeof ResizeObserver !== 'undefined') {
      this.resizeObserver = new ResizeObserver(() => this.resize());
      this.resizeObserver.observe(this.node);
    }
    this.refresh();
  }

  dispose(): void {
    this.resizeObserver?.disconnect();
    this.timeline.dispose();
    this.asker?.dispose();
    this.detail = null;
    this.node.remove();
  }

  /**
   * Where finer detail comes from: a kernel that answers windows and layouts (the widget's), or
   * null (a saved view: it says where its detail runs out).
   */
  setDetail(detail: DetailSource | null): void {
    this.detail = detail;
    this.node.dataset.detail = detail ? 'kernel' : 'saved';
    if (this.showing() === 'trace') {
      this.asker?.setSource(detail);
    }
  }

  setTitle(title: string): void {
    this.title.textContent = title || 'GPU memory';
  }

  /** Show a decoded payload (trace or snapshot, or live samples), or nothing. */
  setView(view: View | null): void {
    this.view = view;
    if (view) {
      if (view.title) {
        this.setTitle(view.title);
      }
      if (view.samples.n > 0 && (view.kind === 'live' || this.samples.n === 0)) {
        this.samples = view.samples;
      }
      this.tab = view.kind === 'live' ? 'live' : 'trace';
    }
    this.asker?.dispose();
    this.asker = view && view.kind !== 'live' ? new DetailAsker(view, this.drawing(), this.detail) : null;
    this.blocks.setView(view && view.kind !== 'live' ? view : null);
    this.refresh();
    if (view && view.kind !== 'live') {
      this.setAt(endIndex(view.nEvents));
    }
  }

  /** Replace the live samples (n rows x 4 float64). */
  setSamples(samples: Samples): void {
    this.samples = samples;
    this.refresh();
  }

  /** "live" while samples arrive (the view says so in its status). */
  setLive(live: boolean): void {
    this.live = live;
    this.refresh();
  }

  get sampleCount(): number {
    return this.samples.n;
  }

  /** Which tab draws: the trace when there is one and it is chosen (or no samples). */
  private showing(): Tab {
    const hasTrace = this.view !== null && this.view.kind !== 'live';
    const hasLive = this.samples.n > 0 || this.view === null || this.view.kind === 'live';
    this.tabs.hidden = !(hasTrace && this.samples.n > 0);
    for (const b of Array.from(this.tabs.querySelectorAll('button'))) {
      b.classList.toggle('gm-on', b.getAttribute('data-tab') === this.tab);
    }
    if (hasTrace && (this.tab === 'trace' || !hasLive)) {
      return 'trace';
    }
    return 'live';
  }

  private refresh(): void {
    const what = this.showing();
    const v = this.view;
    const kind = what === 'live' ? 'live' : v!.kind;
    this.node.dataset.kind = kind;
    this.node.dataset.samples = String(this.samples.n);
    const traceish = what === 'trace' && v !== null;
    const raised = traceish && typeof v.raw.raised === 'string' ? v.raw.raised : '';
    this.raised.hidden = raised === '';
    this.raised.textContent = raised ? `The traced code raised ${raised} — this is what it did until then.` : '';
    const events = traceish && v.nEvents > 0; // a snapshot without trace has no events to move over
    this.controls.hidden = !events;
    this.blocks.node.hidden = !traceish;
    this.pickInfo.hidden = !events;
    this.tables.hidden = !traceish;
    if (what === 'live') {
      this.timeline.setData({ what: 'live', samples: this.samples, running: this.live });
      const S = this.samples;
      const j = S.n - 1;
      this.status.textContent =
        S.n === 0
          ? this.live
            ? 'live · waiting for samples'
            : 'no samples'
          : `${this.live ? 'live' : 'sampled'} · ${formatCount(S.n)} samples · allocated ${formatBytes(S.allocated[j])}` +
            ` · reserved ${formatBytes(S.reserved[j])}` +
            (Number.isNaN(S.device[j]) ? '' : ` · device used ${formatBytes(S.device[j])}`);
      this.info.textContent = '';
      return;
    }
    const raw = v!.raw;
    this.timeline.setData(v!.nEvents > 0 ? { what: 'trace', view: v! } : null);
    this.timeline.node.hidden = v!.nEvents === 0;
    this.asker?.zoomed(...this.shownWindow()); // the finest series known for the window
    this.info.textContent =
      (v!.deviceName ? `${v!.deviceName} · ` : '') +
      (v!.nEvents > 0 ? `${formatCount(v!.nEvents)} events · ` : 'no trace · ') +
      `peak ${formatBytes(raw.peak?.allocated ?? 0)} allocated, ${formatBytes(raw.peak?.reserved ?? 0)} reserved` +
      ((raw.n_ooms ?? 0) > 0 ? ` · ${raw.n_ooms} OOM` : '');
    this.status.textContent = '';
    this.slider.min = '-1';
    this.slider.max = String(endIndex(v!.nEvents));
    this.slider.disabled = v!.nEvents === 0;
    clear(this.tables);
    this.tables.append(sitesTable(raw));
    if (v!.kind !== 'snapshot' || (raw.surviving ?? []).length > 0) {
      this.tables.append(survivingTable(raw)); // only a trace knows what its code left live
    }
  }

  /** Show the layout after event k (``DetailAsker.layoutAt``: exact, asked, or the nearest). */
  setAt(k: number): void {
    const v = this.view;
    if (v && v.kind !== 'live') {
      this.asker?.layoutAt(k);
    }
  }

  private eventText(k: number): string {
    const n = this.view?.nEvents ?? 0;
    return k < 0 ? 'before the trace' : `after event ${formatCount(k)} of ${formatCount(n)}`;
  }

  private shownWindow(): [number, number, number] {
    const [lo, hi] = this.timeline.window;
    return [lo, hi, this.timeline.plotWidth];
  }

  /** How the asker draws into this view. */
  private drawing() {
    return {
      series: (s: Parameters<TimelineView['setSeries']>[0]) => this.timeline.setSeries(s),
      note: (text: string, state: string) => this.setNote(text, state),
      layout: (k: number, lives: Lives, note: string) => this.showLayout(k, lives, note),
      asking: (k: number) => {
        this.k = k;
        this.slider.value = String(k);
        this.atText.textContent = this.eventText(k);
        this.setLayoutNote('asking the kernel for the layout here…');
        this.node.dataset.layout = 'loading';
        this.timeline.setAt(k);
      },
      shown: () => this.shownWindow()
    };
  }

  /** Draw the layout after event k from `lives`, with a note where it is not exact. */
  private showLayout(k: number, lives: Lives, note: string): void {
    this.k = k;
    this.slider.value = String(k);
    this.atText.textContent = this.eventText(k);
    this.setLayoutNote(note);
    const at = this.blocks.show(k, lives);
    this.timeline.setAt(k);
    this.node.dataset.at = String(k);
    this.node.dataset.blocks = String(at?.nBlocks ?? 0);
    this.node.dataset.segments = String(at?.segments.length ?? 0);
    this.node.dataset.layout = lives.exact ? 'kernel' : note ? 'nearest' : 'saved';
    const click = this.pending;
    if (click && click.k === k) {
      this.pending = null;
      this.showPick(click, lives);
    }
  }

  private setLayoutNote(text: string): void {
    this.layoutInfo.textContent = text;
    this.layoutInfo.hidden = text === '';
  }

  private setNote(text: string, state = ''): void {
    this.note.textContent = text;
    this.note.hidden = text === '';
    this.timeline.node.dataset.note = state;
  }

  /** The event the layout shows. */
  get at(): number {
    return this.k;
  }

  private onTimelineClick(c: TimelineClick): void {
    const v = this.view;
    if (!v || this.showing() === 'live') {
      return;
    }
    clear(this.pickInfo);
    delete this.pickInfo.dataset.block;
    const span = c.span && c.span[1] > c.span[0] ? c.span : null;
    this.pickInfo.append(
      h('b', {}, span ? `events ${formatCount(span[0])}–${formatCount(span[1])}` : `event ${formatCount(c.k)}`),
      span
        ? `: allocated up to ${formatBytes(c.allocated)} (after event ${formatCount(c.k)}), reserved up to ${formatBytes(c.reserved)}`
        : `: allocated ${formatBytes(c.allocated)}, reserved ${formatBytes(c.reserved)}`
    );
    this.pending = c.band ? c : null;
    this.setAt(c.k); // the pick follows once the layout at c.k is there (showLayout)
    if (this.pending && this.k !== c.k) {
      this.pending = null; // no kernel, and not a saved checkpoint: no single block to name
      this.pickInfo.append(h('div', { class: 'gm-muted' }, 'no single allocation named here: the saved view keeps the layout at its checkpoints only'));
    }
  }

  /** Name the block under a click on a band, from lives exact at its event. */
  private showPick(c: TimelineClick, lives: Lives): void {
    const v = this.view;
    if (!v || !c.band) {
      return;
    }
    const label = v.timeline.bandLabels[c.band.band] ?? 'other';
    const i = pickBlock(lives, c.k, c.band.band, c.band.offset, v.timeline.bandSites);
    this.pickInfo.append(h('div', {}, h('b', {}, label), `: ${formatBytes(c.band.bytes)} live`));
    if (i < 0) {
      this.pickInfo.append(h('div', { class: 'gm-muted' }, 'no single allocation here (its block was left out of the saved lives)'));
      return;
    }
    const B = lives.blocks;
    this.pickInfo.dataset.block = String(i);
    this.pickInfo.append(
      h(
        'div',
        { class: 'gm-picked' },
        `allocation ${hex(B.addr[i])} · ${formatBytes(B.size[i])} (requested ${formatBytes(Math.min(B.requested[i], B.size[i]))})` +
          (B.start[i] >= 0 ? ` · allocated at event ${B.start[i]}` : ' · allocated before the trace') +
          (B.end[i] < v.nEvents ? `, freed at event ${B.end[i]}` : ', still live at the end')
      ),
      stackNode(lives.stacks, B.stack[i])
    );
  }

  private resize(): void {
    const w = this.node.clientWidth;
    if (w > 0) {
      this.timeline.resize(w);
      this.blocks.resize(w);
    }
  }
}
