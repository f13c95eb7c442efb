// The JupyterLab 4 / Notebook 7 extension: the trace MIME renderer, the widget fallback, and the
// GPU memory panel with the cell badges (lab/plugin.ts).
import type { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { wrapWidgetRenderer } from './fallback';
import { lab } from './lab/plugin';
import { RANK, rendererFactory } from './mime';

/** Draws `application/vnd.jupyter-gpumem.trace+json` outputs, ahead of their HTML and PNG. */
const renderer: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpumem:renderer',
  description: 'Draws saved jupyter_gpumem memory views from their data, with no kernel.',
  autoStart: true,
  requires: [IRenderMimeRegistry],
  activate: (_app: JupyterFrontEnd, registry: IRenderMimeRegistry) => {
    registry.addFactory(rendererFactory, RANK);
  }
};

/**
 * In each notebook, a memory widget that cannot be shown (no kernel, model not found) is drawn
 * from the trace data its output bundle also carries.
 */
const widgetFallback: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpumem:widget-fallback',
  description: 'Shows the saved memory view where a jupyter_gpumem widget cannot be shown.',
  autoStart: true,
  requires: [INotebookTracker, IRenderMimeRegistry],
  activate: (_app: JupyterFrontEnd, tracker: INotebookTracker, registry: IRenderMimeRegistry) => {
    wrapWidgetRenderer(registry);
    tracker.forEach(panel => wrapWidgetRenderer(panel.content.rendermime));
    tracker.widgetAdded.connect((_, panel) => wrapWidgetRenderer(panel.content.rendermime));
  }
};

export default [renderer, widgetFallback, lab];
