// The icon of the GPU memory panel and of the cell badges: a chip, in the theme's ink.
import { LabIcon } from '@jupyterlab/ui-components';

const CHIP = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">
  <g class="jp-icon3" fill="#616161">
    <path d="M4 3.5h8a.5.5 0 0 1 .5.5v8a.5.5 0 0 1-.5.5H4a.5.5 0 0 1-.5-.5V4a.5.5 0 0 1 .5-.5Zm1 1.5v6h6V5Z"/>
    <rect x="6.5" y="6.5" width="3" height="3" rx=".3"/>
    <path d="M5.5 1h1v2h-1zm4 0h1v2h-1zm-4 12h1v2h-1zm4 0h1v2h-1zM1 5.5h2v1H1zm0 4h2v1H1zm12-4h2v1h-2zm0 4h2v1h-2z"/>
  </g>
</svg>`;

/** `jupyter-gpumem:chip`. */
export const chipIcon = new LabIcon({ name: 'jupyter-gpumem:chip', svgstr: CHIP });
