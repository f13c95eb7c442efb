// Name the allocation under a click on a timeline band, from the lives alone. No DOM.
import type { DecodedTimeline, Lives } from './payload';

/** Is block life i in band `band`? Bands name sites; the last band ("other") holds the rest. */
export function inBand(site: number, band: number, bandSites: readonly number[]): boolean {
  if (band < bandSites.length) {
    return site === bandSites[band];
  }
  return !bandSites.includes(site);
}

/**
 * Is block life i in band `band`? Its `band` column says so where the payload has one (bands
 * by site or by holder alike); an older payload's bands are by site (`inBand`).
 */
export function lifeInBand(lives: Lives, i: number, band: number, bandSites: readonly number[]): boolean {
  const B = lives.blocks;
  if (B.band.length === B.n) {
    return B.band[i] === band;
  }
  return inBand(B.site[i], band, bandSites);
}

/**
 * The blocks live after event k in band `band`, stacked as the band draws them: in the order
 * they were made, (start, addr).
 */
export function bandStack(lives: Lives, k: number, band: number, bandSites: readonly number[]): number[] {
  const B = lives.blocks;
  const out: number[] = [];
  for (let i = 0; i < B.n; i++) {
    if (B.start[i] <= k && k < B.end[i] && lifeInBand(lives, i, band, bandSites)) {
      out.push(i);
    }
  }
  out.sort((x, y) => B.start[x] - B.start[y] || B.addr[x] - B.addr[y] || x - y);
  return out;
}

/**
 * The block life under height `offset` (bytes above the band's bottom) in band `band` after
 * event k, blocks stacking by their sizes; a click above the top names the top block, below
 * the bottom the bottom one. -1 when the band has no live block then.
 */
export function pickBlock(
  lives: Lives,
  k: number,
  band: number,
  offset: number,
  bandSites: readonly number[]
): number {
  const stack = bandStack(lives, k, band, bandSites);
  if (stack.length === 0) {
    return -1;
  }
  let top = 0;
  for (const i of stack) {
    top += lives.blocks.size[i];
    if (offset < top) {
      return i;
    }
  }
  return stack[stack.length - 1];
}

/** Which band a height `bytes` at timeline point j falls in, and how far above its bottom. */
export function bandAt(
  tl: DecodedTimeline,
  j: number,
  bytes: number
): { band: number; offset: number; bottom: number; top: number } | null {
  let below = 0;
  for (let g = 0; g < tl.bands.length; g++) {
    const top = below + tl.bands[g][j];
    if (bytes >= below && bytes < top) {
      return { band: g, offset: bytes - below, bottom: below, top };
    }
    below = top;
  }
  return null;
}

/** The timeline point nearest to event k (points are sorted by event). */
export function nearestPoint(index: ArrayLike<number>, k: number): number {
  const n = index.length;
  if (n === 0) {
    return -1;
  }
  let lo = 0;
  let hi = n;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (index[mid] < k) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo >= n) {
    return n - 1;
  }
  if (lo > 0 && k - index[lo - 1] <= index[lo] - k) {
    return lo - 1;
  }
  return lo;
}

/** The column holding event `k`: the last whose first event `index[c]` is <= k (0 if none). */
export function columnAt(index: ArrayLike<number>, k: number): number {
  let lo = 0;
  let hi = index.length - 1;
  let at = 0;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (index[mid] <= k) {
      at = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return index.length ? at : -1;
}
