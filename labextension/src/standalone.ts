// The offline page's script (an IIFE, no imports at run time): reads the view payload from
// <script type="application/json" id="gm-data"> and draws it into <div id="gm-root">.
import { decodePayload, type ViewPayload } from './payload';
import { MemoryView } from './views/view';

function start(): void {
  const root = document.getElementById('gm-root');
  const data = document.getElementById('gm-data');
  if (!root || !data) {
    return;
  }
  try {
    const view = new MemoryView(root);
    view.setView(decodePayload(JSON.parse(data.textContent || 'null') as ViewPayload));
    (window as unknown as { gpumemView?: MemoryView }).gpumemView = view;
  } catch (e) {
    const err = document.createElement('div');
    err.className = 'gm-error';
    err.textContent = `cannot draw this view: ${e instanceof Error ? e.message : String(e)}`;
    root.append(err);
  }
}

if (document.readyState === 'loading') {
  document.addEventListener('DOMContentLoaded', start);
} else {
  start();
}
