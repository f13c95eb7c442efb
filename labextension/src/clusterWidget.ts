// The anywidget render of the cluster view (`view_kind == "cluster"`, see widget.ts). Traits:
// title, interval_s, capacity, workers (WorkerInfo list), running. Custom messages from the
// kernel: {"type": "rounds", first, t, counts, tasks} with two buffers (rows int32, values
// float64); the trait history holds the rounds before the view was shown. To the kernel: {"type": "ready", "have": n} when the view starts or finds a gap.
import { bytesOf, type ColumnData } from './payload';
import { decodeRounds, RoundWindow, type WorkerInfo } from './cluster';
import { ClusterView } from './views/cluster';

export interface Model {
  get(name: string): unknown;
  on(name: string, fn: (...args: any[]) => void): void;
  off(name: string, fn: (...args: any[]) => void): void;
  send(content: unknown, callbacks?: unknown, buffers?: unknown[]): void;
}

function typed<T>(data: ColumnData, make: (b: ArrayBuffer, off: number, n: number) => T, size: number): T {
  const b = bytesOf(data);
  const copy = b.slice(); // aligned
  return make(copy.buffer, 0, Math.floor(copy.byteLength / size));
}

export function renderCluster({ model, el }: { model: Model; el: HTMLElement }): () => void {
  const capacity = Math.max(2, Number(model.get('capacity') ?? 600));
  const win = new RoundWindow(capacity);
  const view = new ClusterView(el, win);
  const onTitle = () => view.setTitle(String(model.get('title') ?? ''));
  const onRunning = () => view.setRunning(Boolean(model.get('running')), Number(model.get('interval_s') ?? 1));
  const onWorkers = () => view.setWorkers((model.get('workers') as WorkerInfo[] | undefined) ?? []);
  const onColor = () => {
    const by = model.get('color_by');
    view.setColorBy(by === 'reserved' ? 'reserved' : 'allocated');
  };
  type RoundsMsg = { type?: string; first?: number; t?: number[]; counts?: number[]; tasks?: string[] };
  const onHistory = () => {
    const h = model.get('history') as (RoundsMsg & { rows?: ColumnData; values?: ColumnData }) | undefined;
    if (h && h.rows && h.values && (h.counts?.length ?? 0) > 0) {
      onCustom({ ...h, type: 'rounds' }, [h.rows, h.values]);
    }
  };
  const onCustom = (msg: RoundsMsg, buffers?: ColumnData[]) => {
    if (msg?.type !== 'rounds' || !buffers || buffers.length < 2) {
      return;
    }
    const first = Number(msg.first ?? 0);
    if (win.length && first > win.next) {
      // a gap (this view was drawn while the kernel was busy): draw on, its columns stay
      // blank, and ask for what is missing, which comes once the kernel is free
      model.send({ type: 'ready', have: win.next });
    }
    const rows = typed(buffers[0], (b, o, n) => new Int32Array(b, o, n), 4);
    const values = typed(buffers[1], (b, o, n) => new Float64Array(b, o, n), 8);
    for (const r of decodeRounds(first, msg.t ?? [], msg.counts ?? [], msg.tasks ?? [], rows, values)) {
      win.push(r);
    }
    view.draw();
  };
  const handlers: Array<[string, (...args: any[]) => void]> = [
    ['change:title', onTitle],
    ['change:running', onRunning],
    ['change:interval_s', onRunning],
    ['change:workers', onWorkers],
    ['change:color_by', onColor],
    ['msg:custom', onCustom]
  ];
  for (const [name, fn] of handlers) {
    model.on(name, fn);
  }
  onTitle();
  onRunning();
  onColor();
  onWorkers();
  onHistory();
  model.send({ type: 'ready', have: win.next });
  return () => {
    for (const [name, fn] of handlers) {
      model.off(name, fn);
    }
    view.dispose();
  };
}
