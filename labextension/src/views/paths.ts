// SVG paths of step curves and areas over a timeline's columns. Pure string building.
import type { LinearScale } from '../scales';
import { n2 } from './dom';

export interface Curve {
  x: ArrayLike<number>;
  y: ArrayLike<number>;
  n: number;
}

/**
 * An SVG path of a step curve: the value holds from one point to the next, and the last one
 * until `end` where given (a column of a level-of-detail series spans to the next one's start).
 */
export function stepPath(c: Curve, sx: LinearScale, sy: LinearScale, end?: number): string {
  const parts: string[] = [];
  let open = false;
  for (let i = 0; i < c.n; i++) {
    const v = c.y[i];
    if (Number.isNaN(v)) {
      open = false;
      continue;
    }
    const x = n2(sx(c.x[i]));
    const y = n2(sy(v));
    if (!open) {
      parts.push(`M${x},${y}`);
      open = true;
    } else {
      parts.push(`H${x}V${y}`);
    }
  }
  if (open && end !== undefined && c.n > 0) {
    parts.push(`H${n2(sx(end))}`);
  }
  return parts.join('');
}

/** A closed step area between `top` and `bottom` (null: zero); the last step up to `end`. */
export function stepArea(
  x: ArrayLike<number>,
  top: ArrayLike<number>,
  bottom: ArrayLike<number> | null,
  n: number,
  sx: LinearScale,
  sy: LinearScale,
  end?: number
): string {
  if (n === 0) {
    return '';
  }
  const up: string[] = [`M${n2(sx(x[0]))},${n2(sy(bottom ? bottom[0] : 0))}`];
  for (let i = 0; i < n; i++) {
    if (i > 0) {
      up.push(`H${n2(sx(x[i]))}`);
    }
    up.push(`V${n2(sy(top[i]))}`);
  }
  if (end !== undefined) {
    up.push(`H${n2(sx(end))}`);
  }
  // back along the bottom: the value at x[i-1] holds until x[i]
  up.push(`V${n2(sy(bottom ? bottom[n - 1] : 0))}`);
  if (end !== undefined) {
    up.push(`H${n2(sx(x[n - 1]))}`);
  }
  for (let i = n - 1; i > 0; i--) {
    up.push(`V${n2(sy(bottom ? bottom[i - 1] : 0))}H${n2(sx(x[i - 1]))}`);
  }
  up.push('Z');
  return up.join('');
}

