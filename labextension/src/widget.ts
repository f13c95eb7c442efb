// The anywidget ESM: `export default { render }`. A model with view_kind "cluster" is the
// cluster heat strip (clusterWidget.ts); otherwise, the memory view. Traits: title, mode ("live" | "final"),
// view (the view payload, binary columns; {} until final), samples ({n, data}: the frozen
// series). Custom messages from the kernel: {"type": "samples", "first": k, "n": m} with one
// buffer of m x 4 float64 rows. To the kernel: {"type": "ready", "have": n} when a view starts.
import {
  bytesOf,
  decodePayload,
  decodeSamples,
  f64 as decodeF64,
  type Column,
  type ColumnData,
  type Samples,
  type ViewPayload
} from './payload';
import { renderCluster } from './clusterWidget';
import { MemoryView } from './views/view';

interface Model {
  get(name: string): unknown;
  on(name: string, fn: (...args: any[]) => void): void;
  off(name: string, fn: (...args: any[]) => void): void;
  send(content: unknown, callbacks?: unknown, buffers?: unknown[]): void;
}

/** Live samples, grown by doubling as messages arrive. */
class SampleBuffer {
  n = 0;
  private rows = new Float64Array(0);

  add(rows: Float64Array, skip: number, count: number): void {
    const need = (this.n + count - skip) * 4;
    if (need > this.rows.length) {
      const next = new Float64Array(Math.max(1024, this.rows.length * 2, need));
      next.set(this.rows.subarray(0, this.n * 4));
      this.rows = next;
    }
    for (let i = skip; i < count; i++) {
      this.rows.set(rows.subarray(4 * i, 4 * i + 4), this.n * 4);
      this.n += 1;
    }
  }

  samples(): Samples {
    return decodeSamples(this.rows.subarray(0, this.n * 4), this.n);
  }
}

function f64(data: ColumnData): Float64Array {
  const b = bytesOf(data);
  return new Float64Array(b.buffer, b.byteOffset, Math.floor(b.byteLength / 8));
}

function render({ model, el }: { model: Model; el: HTMLElement }): () => void {
  if (model.get('view_kind') === 'cluster') {
    return renderCluster({ model, el }); // the cluster heat strip (clusterWidget.ts)
  }
  const view = new MemoryView(el);
  const buf = new SampleBuffer();
  let error: HTMLElement | null = null;

  const showError = (e: unknown) => {
    error?.remove();
    error = document.createElement('div');
    error.className = 'gm-error';
    error.textContent = `jupyter_gpumem: cannot draw this view: ${e instanceof Error ? e.message : String(e)}`;
    el.prepend(error);
  };
  const onTitle = () => view.setTitle(String(model.get('title') ?? ''));
  const onMode = () => view.setLive(model.get('mode') === 'live');
  const onView = () => {
    const p = model.get('view') as ViewPayload | undefined;
    if (!p || typeof p !== 'object' || !('schema' in p)) {
      return;
    }
    try {
      view.setView(decodePayload(p));
      onTitle();
    } catch (e) {
      showError(e);
    }
  };
  const onSamples = () => {
    const s = model.get('samples') as { n?: number; data?: Column } | undefined;
    if (!s || !s.n || !s.data || buf.n >= s.n) {
      return;
    }
    buf.add(decodeF64(s.data), buf.n, s.n);
    view.setSamples(buf.samples());
  };
  const onCustom = (msg: { type?: string; first?: number; n?: number }, buffers?: ColumnData[]) => {
    if (msg?.type !== 'samples' || !buffers || buffers.length === 0) {
      return;
    }
    const first = Number(msg.first ?? 0);
    const n = Number(msg.n ?? 0);
    if (first > buf.n) {
      model.send({ type: 'ready', have: buf.n }); // a gap: ask again from what we have
      return;
    }
    buf.add(f64(buffers[0]), buf.n - first, n);
    view.setSamples(buf.samples());
  };
  const handlers: Array<[string, (...args: any[]) => void]> = [
    ['change:title', onTitle],
    ['change:mode', onMode],
    ['change:view', onView],
    ['change:samples', onSamples],
    ['msg:custom', onCustom]
  ];
  for (const [name, fn] of handlers) {
    model.on(name, fn);
  }
  onTitle();
  onMode();
  onSamples();
  onView();
  if (model.get('mode') === 'live') {
    model.send({ type: 'ready', have: buf.n });
  }
  return () => {
    for (const [name, fn] of handlers) {
      model.off(name, fn);
    }
    view.dispose();
  };
}

export default { render };
