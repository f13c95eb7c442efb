// Linear scales and zoom windows. No DOM.

export interface LinearScale {
  (v: number): number;
  invert(px: number): number;
  domain: readonly [number, number];
  range: readonly [number, number];
}

/** Map [d0, d1] onto [r0, r1] linearly; a zero-width domain maps everything to r0. */
export function linearScale(
  domain: readonly [number, number],
  range: readonly [number, number]
): LinearScale {
  const [d0, d1] = domain;
  const [r0, r1] = range;
  const k = d1 !== d0 ? (r1 - r0) / (d1 - d0) : 0;
  const f = ((v: number) => r0 + (v - d0) * k) as LinearScale;
  f.invert = (px: number) => (k !== 0 ? d0 + (px - r0) / k : d0);
  f.domain = [d0, d1];
  f.range = [r0, r1];
  return f;
}

/**
 * The window [lo, hi] moved inside [min, max]: at least `minSpan` wide (or the whole extent
 * if that is narrower), shifted back inside rather than cut where possible.
 */
export function clampDomain(
  lo: number,
  hi: number,
  min: number,
  max: number,
  minSpan = 0
): [number, number] {
  if (hi < lo) {
    [lo, hi] = [hi, lo];
  }
  const extent = max - min;
  let span = Math.max(hi - lo, Math.min(minSpan, extent));
  if (span >= extent) {
    return [min, max];
  }
  if (span <= 0) {
    span = 0;
  }
  const mid = (lo + hi) / 2;
  let a = mid - span / 2;
  let b = mid + span / 2;
  if (a < min) {
    b += min - a;
    a = min;
  }
  if (b > max) {
    a -= b - max;
    b = max;
  }
  return [Math.max(a, min), Math.min(b, max)];
}

/**
 * Zoom the window [lo, hi] by `factor` (< 1 zooms in) about `at`, which stays where it is on
 * the screen; the result is clamped to [min, max] and at least `minSpan` wide.
 */
export function zoomDomain(
  domain: readonly [number, number],
  at: number,
  factor: number,
  extent: readonly [number, number],
  minSpan = 0
): [number, number] {
  const [lo, hi] = domain;
  const a = at - (at - lo) * factor;
  const b = at + (hi - at) * factor;
  return clampDomain(a, b, extent[0], extent[1], minSpan);
}

/** The index of the first element of the sorted `arr[0..n)` that is >= x (n if none). */
export function lowerBound(arr: ArrayLike<number>, x: number, n = arr.length): number {
  let lo = 0;
  let hi = n;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (arr[mid] < x) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}
