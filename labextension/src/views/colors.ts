// The colours every view uses (the same as the matplotlib pictures).
export const ALLOCATED = '#111111';
export const RESERVED = '#d62728';
export const DEVICE = '#7f7f7f';
export const OTHER = '#bbbbbb';
export const BLOCK = '#1f77b4';
export const ROUNDING = '#9ecae1';
export const CACHED = '#e3e3e3';
/** Unmapped ranges of an expandable segment: a light hatch (stripes on a background). */
export const UNMAPPED = '#c8c8c8';
export const UNMAPPED_BG = '#ffffff';
export const SMALL_POOL = '#9467bd';
export const LARGE_POOL = '#2ca02c';
export const BANDS = [
  '#1f77b4',
  '#ff7f0e',
  '#2ca02c',
  '#9467bd',
  '#8c564b',
  '#e377c2',
  '#17becf',
  '#bcbd22',
  '#7f7f7f',
  '#d62728'
];

/** The colour of band g of n (the last band is "other"). */
export function bandColor(g: number, n: number): string {
  return g === n - 1 ? OTHER : BANDS[g % BANDS.length];
}
