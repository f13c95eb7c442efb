// The GPU memory side panel: the active notebook's session timeline (a lane a source and
// device, cells marked, the peak), its cells as a sortable table, the devices, the sources.
// Clicking a cell's mark, span or row scrolls the notebook to that cell.
import type { NotebookPanel } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';
import { formatBytes } from '../format';
import { clear, h } from '../views/dom';
import { TimelineView } from '../views/timeline';
import { cellRows } from './cellRows';
import { deviceParts, deviceTitle } from './deviceParts';
import { chipIcon } from './icon';
import type { Lane, SourceInfo } from './schema';
import { spanAt, toSamples, withTail } from './series';
import type { NotebookSession } from './session';
import { CellTable } from './tableView';

/** The words under the panel's title: where what it shows comes from. */
export function statusText(session: NotebookSession | null): string {
  if (!session) {
    return 'No notebook is active.';
  }
  const saved = session.origin === 'saved' ? ' · as the notebook saved it' : '';
  switch (session.status) {
    case 'connected':
      if (session.origin !== 'live') {
        return 'Live · waiting for the kernel';
      }
      return session.running ? 'Live · a cell is running' : 'Live from the kernel';
    case 'waiting':
      return `The kernel has not loaded jupyter_gpumem${saved}`;
    case 'unloaded':
      return 'jupyter_gpumem was unloaded · the session until then';
    default:
      return `No kernel${saved}`;
  }
}

function section(title: string, ...children: Node[]): HTMLElement {
  return h('section', { class: 'jp-GpumemPanel-section' }, h('h3', {}, title), ...children);
}

/** The side panel (`#jupyter-gpumem-panel`), showing one notebook's session (`setSession`). */
export class GpuMemPanel extends Widget {
  private session: NotebookSession | null = null;
  private readonly status: HTMLDivElement;
  private readonly lanesNode: HTMLDivElement;
  private readonly devicesNode: HTMLDivElement;
  private readonly sourcesNode: HTMLDivElement;
  private readonly hint: HTMLDivElement;
  private readonly table: CellTable;
  private readonly timelines = new Map<string, TimelineView>();
  private readonly resizeObserver: ResizeObserver | null = null;
  private frame = 0;
  private selectedCell: string | null = null;

  constructor() {
    super();
    this.id = 'jupyter-gpumem-panel';
    this.addClass('jp-GpumemPanel');
    this.title.icon = chipIcon;
    this.title.caption = 'GPU memory';
    this.status = h('div', { class: 'jp-GpumemPanel-status' });
    this.hint = h('div', { class: 'jp-GpumemPanel-hint' });
    this.lanesNode = h('div', { class: 'jp-GpumemPanel-lanes' });
    this.table = new CellTable(row => this.pick(row.cellId));
    this.devicesNode = h('div', { class: 'jp-GpumemPanel-devices' });
    this.sourcesNode = h('div', { class: 'jp-GpumemPanel-sources' });
    this.node.append(
      h('header', { class: 'jp-GpumemPanel-header' }, h('h2', {}, 'GPU memory'), this.status),
      this.hint,
      section(
        'Session',
        this.lanesNode,
        h('div', { class: 'jp-GpumemPanel-note' }, 'Seconds spent running cells (idle time left out). Click a cell’s span to go to it.')
      ),
      section('Cells', this.table.node),
      section('Devices', this.devicesNode),
      section('Sources', this.sourcesNode)
    );
    if (typeof ResizeObserver !== 'undefined') {
      this.resizeObserver = new ResizeObserver(() => this.resizeTimelines());
      this.resizeObserver.observe(this.node);
    }
    this.draw();
  }

  dispose(): void {
    this.resizeObserver?.disconnect();
    for (const t of this.timelines.values()) {
      t.dispose();
    }
    this.setSession(null);
    super.dispose();
  }

  /** Follow `session` (the active notebook's), or none. */
  setSession(session: NotebookSession | null): void {
    if (session === this.session) {
      return;
    }
    this.session?.changed.disconnect(this.schedule, this);
    this.session = session;
    this.session?.changed.connect(this.schedule, this);
    this.selectedCell = null;
    this.draw();
  }

  /** Mark the row of cell `cellId` (a badge was clicked). */
  showCell(cellId: string): void {
    this.selectedCell = cellId;
    this.draw();
  }

  private schedule(): void {
    if (!this.frame) {
      this.frame = requestAnimationFrame(() => {
        this.frame = 0;
        this.draw();
      });
    }
  }

  private draw(): void {
    const session = this.session;
    this.node.dataset.status = session?.status ?? 'none';
    this.node.dataset.origin = session?.origin ?? 'none';
    this.status.textContent = statusText(session);
    const name = session?.panel.context.localPath ?? '';
    this.status.title = name;
    const lanes = session ? session.series.allLanes() : [];
    const entries = session ? session.entries() : [];
    this.hint.hidden = !!session && (lanes.length > 0 || entries.length > 0);
    this.hint.textContent = !session
      ? 'Open a notebook to see its GPU memory here.'
      : session.status === 'waiting' || session.status === 'no-kernel'
        ? 'Run %load_ext jupyter_gpumem in this notebook: each cell’s GPU memory shows here, and under the cell, as it runs.'
        : 'No cell has run since jupyter_gpumem was loaded.';
    this.drawLanes(lanes);
    const rows = cellRows(entries);
    this.table.setRows(rows);
    const selected = rows.find(r => r.cellId === this.selectedCell);
    this.table.select(selected ? selected.key : null);
    this.drawDevices();
    this.drawSources(session?.sources ?? []);
  }

  private drawLanes(lanes: Lane[]): void {
    const session = this.session;
    for (const [key, t] of this.timelines) {
      if (!lanes.some(l => l.key === key)) {
        t.dispose();
        t.node.parentElement?.remove();
        this.timelines.delete(key);
      }
    }
    if (lanes.length === 0) {
      clear(this.lanesNode);
      this.lanesNode.append(h('div', { class: 'jp-GpumemPanel-empty' }, 'No samples yet.'));
      return;
    }
    this.lanesNode.querySelector('.jp-GpumemPanel-empty')?.remove();
    const spans = session?.series.spans ?? [];
    const marks = spans.map(s => [s.start, `[${s.cell}]`] as const);
    for (const lane of lanes) {
      let view = this.timelines.get(lane.key);
      if (!view) {
        const key = lane.key;
        view = new TimelineView(c => this.pick(null, key, c.k));
        this.timelines.set(lane.key, view);
        const title = h('div', { class: 'jp-GpumemPanel-lane' });
        this.lanesNode.append(h('div', { class: 'gm-view jp-GpumemPanel-timeline', 'data-lane': lane.key }, title, view.node));
      }
      const wrap = view.node.parentElement!;
      const peak = lane.samples.reduce((m, r) => Math.max(m, r[1]), 0);
      wrap.querySelector('.jp-GpumemPanel-lane')!.textContent =
        `${lane.source} · device ${lane.device}${lane.device_name ? ` (${lane.device_name})` : ''} · peak ${formatBytes(peak)}`;
      const rows = session?.running ? lane.samples : withTail(lane.samples);
      view.setData({ what: 'live', samples: toSamples(rows), running: session?.running, marks: { cells: marks, peak: true } });
    }
    this.resizeTimelines();
  }

  private resizeTimelines(): void {
    const width = this.lanesNode.clientWidth;
    for (const t of this.timelines.values()) {
      t.resize(width);
    }
  }

  /** Go to the cell `cellId` in the notebook (from a row, or the timeline at sample `k`). */
  private pick(cellId: string | null, lane?: string, k?: number): void {
    const session = this.session;
    if (lane !== undefined && k !== undefined) {
      // the live timeline's click is on a sample; the cell is the one whose span holds it
      const rows = session?.series.allLanes().find(l => l.key === lane)?.samples ?? [];
      cellId = spanAt(session?.series.spans ?? [], rows[k]?.[0] ?? -1)?.cell_id ?? null;
    }
    if (!session || !cellId) {
      return;
    }
    this.selectedCell = cellId;
    const rowsNow = cellRows(session.entries());
    this.table.select(rowsNow.find(r => r.cellId === cellId)?.key ?? null);
    void scrollToCell(session.panel, cellId);
  }

  private drawDevices(): void {
    clear(this.devicesNode);
    const devices = this.session?.devices ?? [];
    if (devices.length === 0) {
      this.devicesNode.append(h('div', { class: 'jp-GpumemPanel-empty' }, 'No device read yet.'));
      return;
    }
    for (const d of devices) {
      const parts = deviceParts(d);
      const bar = h('div', { class: 'jp-GpumemPanel-bar', role: 'img', 'aria-label': parts.map(p => `${p.label} ${p.detail}`).join(', ') });
      const legend = h('ul', { class: 'jp-GpumemPanel-legend' });
      for (const p of parts) {
        const seg = h('span', { class: `jp-GpumemPanel-part jp-mod-${p.kind}`, title: `${p.label}: ${p.detail}` });
        seg.style.width = `${(p.share * 100).toFixed(3)}%`;
        bar.append(seg);
        legend.append(
          h('li', {}, h('i', { class: `jp-GpumemPanel-swatch jp-mod-${p.kind}` }), h('b', {}, p.label), ` ${p.detail}`)
        );
      }
      this.devicesNode.append(h('div', { class: 'jp-GpumemPanel-device', 'data-device': d.device }, h('div', { class: 'jp-GpumemPanel-deviceTitle' }, deviceTitle(d)), bar, legend));
    }
  }

  private drawSources(sources: SourceInfo[]): void {
    clear(this.sourcesNode);
    if (sources.length === 0) {
      this.sourcesNode.append(h('div', { class: 'jp-GpumemPanel-empty' }, 'No source read yet.'));
      return;
    }
    const list = h('ul', { class: 'jp-GpumemPanel-sourceList' });
    for (const s of sources) {
      const config = s.config === null ? '' : ` · config: ${s.config || 'defaults'}`;
      list.append(
        h('li', { 'data-source': s.name }, h('b', {}, s.name), ` ${s.title} · ${s.history}${config}`, ...s.notes.map(n => h('div', { class: 'jp-GpumemPanel-note' }, n)))
      );
    }
    this.sourcesNode.append(list);
  }
}

/** Make cell `cellId` of `panel` the active one and scroll it into view; false if not found. */
export async function scrollToCell(panel: NotebookPanel, cellId: string): Promise<boolean> {
  const notebook = panel.content;
  const index = notebook.widgets.findIndex(c => c.model.id === cellId);
  if (index < 0) {
    return false;
  }
  notebook.activeCellIndex = index;
  const cell = notebook.widgets[index];
  await notebook.scrollToCell(cell, 'start');
  cell.addClass('jp-GpumemPanel-flash');
  window.setTimeout(() => cell.removeClass('jp-GpumemPanel-flash'), 1200);
  return true;
}
