// When a saved widget cannot be shown (no kernel, or its model is gone), draw the trace MIME
// data that the same output bundle carries instead of "Error displaying widget".
import type { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { MessageLoop, type Message } from '@lumino/messaging';
import { Panel, type Widget } from '@lumino/widgets';
import { MIME_TYPE, TraceRenderer } from './mime';

export const WIDGET_VIEW_MIME = 'application/vnd.jupyter.widget-view+json';

/** How long a widget may take to appear before the saved view stands in for it. */
export const FALLBACK_AFTER_MS = 4000;

const WRAPPED = Symbol('jupyter-gpumem-fallback');

function hasChild(w: Widget): boolean {
  return Array.from(w.children()).length > 0;
}

/** The widget-view renderer, in a panel that shows our view while the widget has no view. */
export class FallbackRenderer extends Panel implements IRenderMime.IRenderer {
  private fallback: TraceRenderer | null = null;
  private readonly hook = (_: unknown, msg: Message): boolean => {
    if (msg.type === 'child-added') {
      this.dropFallback(); // the widget came after all
    }
    return true;
  };

  constructor(private readonly inner: IRenderMime.IRenderer) {
    super();
    this.addClass('jp-GpumemWidgetFallback');
    this.node.dataset.mimeType = WIDGET_VIEW_MIME;
    this.addWidget(inner);
    MessageLoop.installMessageHook(inner, this.hook);
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this.dropFallback();
    if (!(MIME_TYPE in model.data)) {
      return this.inner.renderModel(model);
    }
    let timer = 0;
    const late = new Promise<void>(resolve => {
      timer = window.setTimeout(resolve, FALLBACK_AFTER_MS);
    });
    const done = this.inner.renderModel(model).catch(() => undefined);
    await Promise.race([done, late]);
    window.clearTimeout(timer);
    if (!this.isDisposed && !hasChild(this.inner)) {
      await this.showFallback(model);
    }
  }

  private async showFallback(model: IRenderMime.IMimeModel): Promise<void> {
    const view = new TraceRenderer(MIME_TYPE);
    this.fallback = view;
    this.inner.hide();
    this.addWidget(view);
    await view.renderModel(model);
  }

  private dropFallback(): void {
    if (this.fallback) {
      this.fallback.dispose();
      this.fallback = null;
    }
    this.inner.show();
  }

  dispose(): void {
    if (!this.isDisposed) {
      MessageLoop.removeMessageHook(this.inner, this.hook);
    }
    super.dispose();
  }
}

type Factory = IRenderMime.IRendererFactory & { [WRAPPED]?: true };

function wrap(factory: Factory): Factory {
  if (factory[WRAPPED]) {
    return factory;
  }
  return {
    ...factory,
    [WRAPPED]: true,
    createRenderer: options => new FallbackRenderer(factory.createRenderer(options))
  };
}

const PATCHED = new WeakSet<IRenderMimeRegistry>();

/**
 * Wrap the widget-view factory of `registry`, now and whenever one is added later (the widget
 * manager replaces it per notebook, and again when the kernel changes).
 */
export function wrapWidgetRenderer(registry: IRenderMimeRegistry): void {
  if (PATCHED.has(registry)) {
    return;
  }
  PATCHED.add(registry);
  const add = registry.addFactory.bind(registry);
  registry.addFactory = (factory: IRenderMime.IRendererFactory, rank?: number) => {
    const wrapped = factory.mimeTypes.includes(WIDGET_VIEW_MIME) ? wrap(factory) : factory;
    add(wrapped, rank);
  };
  const current = registry.getFactory(WIDGET_VIEW_MIME) as Factory | undefined;
  if (current && !current[WRAPPED]) {
    const rank = registry.getRank(WIDGET_VIEW_MIME);
    registry.removeMimeType(WIDGET_VIEW_MIME);
    add(wrap(current), rank);
  }
}
