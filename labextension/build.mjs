// Bundles for outside JupyterLab: the anywidget ESM, the offline page's IIFE, the shared CSS.
// `node build.mjs [--production]`; JupyterLab's own bundle comes from `jupyter-builder build`.
import * as esbuild from 'esbuild';

const production = process.argv.includes('--production');
const out = '../jupyter_gpumem/render/static/dist';
const common = {
  bundle: true,
  minify: production,
  sourcemap: false,
  target: ['es2020'],
  legalComments: 'none',
  logLevel: 'info'
};

await Promise.all([
  esbuild.build({ ...common, entryPoints: ['src/widget.ts'], format: 'esm', outfile: `${out}/widget.js` }),
  esbuild.build({ ...common, entryPoints: ['src/standalone.ts'], format: 'iife', outfile: `${out}/viewer.js` }),
  esbuild.build({ ...common, entryPoints: ['style/view.css'], outfile: `${out}/view.css` })
]);
