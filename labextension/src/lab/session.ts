// One notebook's GPU memory session, as the panel and the badges read it: live from its kernel's
// channel, else from what the notebook saved. It writes each cell's badge into the cell's
// metadata when the kernel's record for it arrives, and the panel's view of the session into
// the notebook's metadata (bounded), so a notebook reopened with no kernel shows both again.
import type { ICellModel, ICodeCellModel } from '@jupyterlab/cells';
import type { NotebookPanel } from '@jupyterlab/notebook';
import { type ISignal, Signal } from '@lumino/signaling';
import { type ChannelStatus, KernelChannel } from './channel';
import {
  type CellBadge,
  type CellEntry,
  type DeviceUse,
  type KernelMessage,
  LAB_SCHEMA,
  METADATA_KEY,
  type NotebookRecord,
  readBadge,
  readNotebookRecord,
  SAVED_POINTS,
  SAVED_SPANS,
  type SourceInfo
} from './schema';
import { SessionSeries } from './series';

/** What the session shows: the kernel's ('live'), the notebook's saved record, or nothing. */
export type Origin = 'live' | 'saved' | 'none';

export interface SessionOptions {
  /** Whether badges and the session go into the notebook's metadata (a setting). */
  save(): boolean;
}

function same(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

/** One notebook's session: its channel, its series, devices and sources, its cells' badges. */
export class NotebookSession {
  readonly series = new SessionSeries();
  readonly channel: KernelChannel;
  devices: DeviceUse[] = [];
  sources: SourceInfo[] = [];
  /** A cell runs now (samples are coming). */
  running = false;
  origin: Origin = 'none';
  /** The kernel's badges of this session, by cell id (shown even when not saved). */
  private readonly live = new Map<string, CellBadge>();
  private readonly _changed = new Signal<this, void>(this);
  private disposed = false;

  constructor(
    readonly panel: NotebookPanel,
    private readonly options: SessionOptions
  ) {
    this.channel = new KernelChannel(panel.sessionContext);
    this.channel.received.connect((_, msg) => this.onMessage(msg));
    this.channel.statusChanged.connect(() => this._changed.emit());
    void panel.context.ready.then(() => {
      if (this.disposed) {
        return;
      }
      this.loadSaved();
      panel.model?.cells.changed.connect(() => this._changed.emit());
    });
    panel.disposed.connect(() => this.dispose());
  }

  /** Emitted on anything new to show (many times a second at most while a cell runs). */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get status(): ChannelStatus {
    return this.channel.status;
  }

  dispose(): void {
    if (!this.disposed) {
      this.disposed = true;
      this.channel.dispose();
      Signal.clearData(this);
    }
  }

  /** A cell's badge: the kernel's of this session, else the one its metadata keeps. */
  badgeOf(cell: ICellModel): CellBadge | null {
    return this.live.get(cell.id) ?? readBadge(cell.getMetadata(METADATA_KEY));
  }

  /** Every cell with a badge, in the notebook's order. */
  entries(): Array<{ cellId: string; index: number; badge: CellBadge }> {
    const out: Array<{ cellId: string; index: number; badge: CellBadge }> = [];
    const cells = this.panel.model?.cells;
    if (!cells) {
      return out;
    }
    let index = 0;
    for (const cell of cells) {
      const badge = cell.type === 'code' ? this.badgeOf(cell) : null;
      if (badge) {
        out.push({ cellId: cell.id, index, badge });
      }
      index++;
    }
    return out;
  }

  /** The position of the cell with id `cellId` in the notebook, -1 if none. */
  indexOf(cellId: string | null): number {
    const cells = this.panel.model?.cells;
    if (!cells || !cellId) {
      return -1;
    }
    let index = 0;
    for (const cell of cells) {
      if (cell.id === cellId) {
        return index;
      }
      index++;
    }
    return -1;
  }

  private cellModel(cellId: string | null): ICodeCellModel | null {
    const i = this.indexOf(cellId);
    const cell = i >= 0 ? this.panel.model?.cells.get(i) : undefined;
    return cell && cell.type === 'code' ? (cell as ICodeCellModel) : null;
  }

  /** The notebook's saved record, shown until the kernel says more. */
  private loadSaved(): void {
    const record = readNotebookRecord(this.panel.model?.getMetadata(METADATA_KEY));
    if (record && this.origin !== 'live') {
      this.series.reset(record.lanes, record.spans);
      this.devices = record.devices;
      this.sources = record.sources;
      this.origin = 'saved';
    }
    this._changed.emit();
  }

  private onMessage(msg: KernelMessage): void {
    switch (msg.type) {
      case 'state':
        this.origin = 'live';
        this.series.reset(msg.lanes, msg.spans);
        this.devices = msg.devices;
        this.sources = msg.sources;
        this.running = msg.running;
        for (const entry of msg.cells) {
          this.takeBadge(entry, true);
        }
        break;
      case 'samples':
        this.origin = 'live';
        this.running = true;
        for (const lane of msg.new_lanes ?? []) {
          this.series.addLane(lane);
        }
        for (const [key, rows] of Object.entries(msg.lanes)) {
          this.series.append(key, rows);
        }
        break;
      case 'cell':
        this.origin = 'live';
        this.running = false;
        for (const lane of msg.new_lanes ?? []) {
          this.series.addLane(lane);
        }
        for (const [key, rows] of Object.entries(msg.lanes ?? {})) {
          this.series.append(key, rows);
        }
        this.series.putSpan(msg.span);
        this.devices = msg.devices ?? this.devices;
        this.sources = msg.sources ?? this.sources;
        this.takeBadge(msg, false);
        this.saveRecord();
        break;
    }
    this._changed.emit();
  }

  /**
   * Keep a cell's badge, and write it into the cell's metadata when saving. From a state
   * message (`catchingUp`), only a badge of the cell's own last run that its metadata lacks
   * (a cell that ran while no notebook listened): opening a notebook changes nothing else.
   */
  private takeBadge(entry: CellEntry, catchingUp: boolean): void {
    const { cell_id: cellId, badge } = entry;
    if (!cellId || !badge) {
      return;
    }
    this.live.set(cellId, badge);
    const cell = this.cellModel(cellId);
    if (!cell || !this.options.save()) {
      return;
    }
    if (catchingUp && cell.executionCount !== badge.execution_count) {
      return;
    }
    if (!same(cell.getMetadata(METADATA_KEY), badge)) {
      cell.setMetadata(METADATA_KEY, badge);
    }
  }

  /** Write the session's bounded record into the notebook's metadata. */
  private saveRecord(): void {
    const model = this.panel.model;
    if (!model || !this.options.save()) {
      return;
    }
    const { lanes, spans } = this.series.saved(SAVED_POINTS, SAVED_SPANS);
    const record: NotebookRecord = { version: LAB_SCHEMA, lanes, spans, devices: this.devices, sources: this.sources };
    model.setMetadata(METADATA_KEY, record);
  }
}
