// The MIME renderer of `application/vnd.jupyter-gpumem.trace+json`: the view payload with
// base64 columns, drawn from the saved data alone (no kernel).
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';
import { decodePayload, type ViewPayload } from './payload';
import { MemoryView } from './views/view';

export const MIME_TYPE = 'application/vnd.jupyter-gpumem.trace+json';

/** Lower ranks win: ahead of text/html (~50) and image/png (~90), behind nothing of ours. */
export const RANK = 0;

export class TraceRenderer extends Widget implements IRenderMime.IRenderer {
  private view: MemoryView | null = null;

  constructor(private readonly mimeType: string = MIME_TYPE) {
    super();
    this.addClass('jp-GpumemRenderer');
    this.node.dataset.mimeType = mimeType; // as JupyterLab's own renderers mark their output
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this.view?.dispose();
    this.view = null;
    while (this.node.firstChild) {
      this.node.removeChild(this.node.firstChild);
    }
    try {
      const payload = model.data[this.mimeType] as unknown as ViewPayload;
      this.view = new MemoryView(this.node);
      this.view.setView(decodePayload(payload));
    } catch (e) {
      this.view?.dispose();
      this.view = null;
      const err = document.createElement('div');
      err.className = 'gm-error';
      err.textContent = `jupyter_gpumem: cannot draw this view: ${e instanceof Error ? e.message : String(e)}`;
      this.node.append(err);
    }
  }

  dispose(): void {
    this.view?.dispose();
    this.view = null;
    super.dispose();
  }
}

export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: true,
  mimeTypes: [MIME_TYPE],
  defaultRank: RANK,
  createRenderer: options => new TraceRenderer(options.mimeType)
};
