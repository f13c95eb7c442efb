// The anywidget ESM: `export default { render }`. A model with view_kind "cluster" is the
// cluster heat strip (clusterWidget.ts); otherwise, the memory view. Traits: title, mode ("live" | "final"),
// view (the view payload, binary columns; {} until final), samples ({n, data}: the frozen
// series), detail (the kernel answers windows and layouts). Custom messages from the kernel:
// {"type": "samples", "first": k, "n": m} with one buffer of m x 4 float64 rows; answers
// {"type": "window" | "layout" | "error", "id": j, ...} with their columns as buffers. To the
// kernel: {"type": "ready", "have": n} when a view starts; {"type": "window", "id", "i0", "i1",
// "columns"} and {"type": "layout", "id", "k"} (Note [A view asks the kernel] in widget.py).
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
import { decodeWindow, type DetailSource, joinBuffers } from './detail';
import { decodeLives, type LivesPayload } from './payload';
import { MemoryView } from './views/view';

/** How long a question to the kernel may take before the view gives up on it (ms). */
export const ANSWER_TIMEOUT_MS = 20000;

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

/** A kernel behind `model` that answers the view's windows and layouts. */
class KernelDetail implements DetailSource {
  private next = 0;
  private readonly waiting = new Map<number, { resolve: (m: Record<string, unknown>) => void; reject: (e: Error) => void; timer: number }>();

  constructor(private readonly model: Model, private readonly nEvents: () => number) {}

  window(i0: number, i1: number, columns: number) {
    return this.ask({ type: 'window', i0, i1, columns }).then(m => decodeWindow(m, this.nEvents()));
  }

  layout(k: number) {
    return this.ask({ type: 'layout', k }).then(m => decodeLives(m.lives as LivesPayload));
  }

  /** An answer (or error) from the kernel: settle its question. */
  answer(msg: Record<string, unknown>, buffers: ColumnData[]): boolean {
    const q = this.waiting.get(Number(msg.id));
    if (!q) {
      return false;
    }
    this.waiting.delete(Number(msg.id));
    window.clearTimeout(q.timer);
    if (msg.type === 'error') {
      q.reject(new Error(String(msg.message ?? 'error')));
    } else {
      try {
        q.resolve(joinBuffers(msg, buffers) as Record<string, unknown>);
      } catch (e) {
        q.reject(e instanceof Error ? e : new Error(String(e)));
      }
    }
    return true;
  }

  dispose(): void {
    for (const q of this.waiting.values()) {
      window.clearTimeout(q.timer);
      q.reject(new Error('the view closed'));
    }
    this.waiting.clear();
  }

  private ask(question: Record<string, unknown>): Promise<Record<string, unknown>> {
    const id = ++this.next;
    return new Promise((resolve, reject) => {
      const timer = window.setTimeout(() => {
        this.waiting.delete(id);
        reject(new Error(`no answer in ${ANSWER_TIMEOUT_MS / 1000} s: a cell may be running`));
      }, ANSWER_TIMEOUT_MS);
      this.waiting.set(id, { resolve, reject, timer });
      this.model.send({ ...question, id });
    });
  }
}

function render({ model, el }: { model: Model; el: HTMLElement }): () => void {
  if (model.get('view_kind') === 'cluster') {
    return renderCluster({ model, el }); // the cluster heat strip (clusterWidget.ts)
  }
  const view = new MemoryView(el);
  const buf = new SampleBuffer();
  let nEvents = 0;
  const kernel = new KernelDetail(model, () => nEvents);
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
      const decoded = decodePayload(p);
      nEvents = decoded.nEvents;
      view.setView(decoded);
      onTitle();
      onDetail();
    } catch (e) {
      showError(e);
    }
  };
  const onDetail = () => view.setDetail(model.get('detail') === true ? kernel : null);
  const onSamples = () => {
    const s = model.get('samples') as { n?: number; data?: Column } | undefined;
    if (!s || !s.n || !s.data || buf.n >= s.n) {
      return;
    }
    buf.add(decodeF64(s.data), buf.n, s.n);
    view.setSamples(buf.samples());
  };
  const onCustom = (msg: { type?: string; first?: number; n?: number }, buffers?: ColumnData[]) => {
    if (msg?.type === 'window' || msg?.type === 'layout' || msg?.type === 'error') {
      kernel.answer(msg as Record<string, unknown>, buffers ?? []);
      return;
    }
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
    ['change:detail', onDetail],
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
    kernel.dispose();
    view.dispose();
  };
}

export default { render };
