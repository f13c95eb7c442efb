// Axis ticks a person can read. No DOM.
import { byteTickLabel } from './format';

export type TickKind = 'bytes' | 'events' | 'seconds';
export type Tick = readonly [value: number, label: string];

/**
 * The step for about `count` steps up to `span`: "bytes" by a power of two bytes (128 MiB,
 * 256 MiB, ...), "events" by a whole 1, 2 or 5 times a power of ten, "seconds" by 1, 2 or 5
 * times any power of ten.
 */
export function tickStep(span: number, kind: TickKind, count = 5): number {
  const raw = Math.max(span, 0) / count;
  if (kind === 'bytes') {
    return 2 ** Math.max(0, Math.ceil(Math.log2(Math.max(raw, 1))));
  }
  const e = raw > 0 ? Math.floor(Math.log10(raw)) : 0;
  const m = raw / 10 ** e;
  const mult = m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10;
  const step = mult * 10 ** e;
  return kind === 'events' ? Math.max(1, step) : step;
}

function label(v: number, kind: TickKind, step: number): string {
  if (kind === 'bytes') {
    return byteTickLabel(v);
  }
  return kind === 'seconds' ? `${v} s` : eventLabel(v, step);
}

/**
 * An event tick of an axis stepping by `step`: millions as "4M" / "4.1M" where the step is a
 * hundred thousand or more, else with thousands separators past 9,999 ("150,500"), else plain.
 */
export function eventLabel(v: number, step: number): string {
  if (v >= 1e6 && step >= 1e5) {
    const digits = Math.max(0, 6 - Math.round(Math.log10(step)));
    return `${Number((v / 1e6).toFixed(digits))}M`;
  }
  return v >= 1e4 ? v.toLocaleString('en-US') : String(v);
}

/**
 * Ticks from 0 up to `top` as [value, label] pairs, about `count` steps (default 5).
 * Bytes are labelled exactly ("0", "128 MiB", "1.25 GiB"), events as whole numbers, seconds
 * with no float noise ("0.3 s", never "0.30000000000000004 s").
 */
export function axisTicks(top: number, kind: TickKind, count = 5): Tick[] {
  return rangeTicks(0, top, kind, count);
}

/**
 * Ticks at the multiples of one round step that lie in [lo, hi] (a zoomed axis), about
 * `count` steps. `axisTicks(top)` is `rangeTicks(0, top)`.
 */
export function rangeTicks(lo: number, hi: number, kind: TickKind, count = 5): Tick[] {
  const step = tickStep(hi - lo, kind, count);
  const digits = kind === 'seconds' ? Math.max(0, -Math.floor(Math.log10(step) + 1e-9)) : 0;
  const out: Tick[] = [];
  const first = Math.ceil(lo / step - 1e-9) + 0; // never -0
  for (let i = first; i * step <= hi + Math.abs(hi) * 1e-12; i++) {
    const v = kind === 'seconds' ? Number((i * step).toFixed(digits)) : i * step;
    out.push([v, label(v, kind, step)]);
    if (out.length > 1000) {
      break; // a degenerate range: never loop for ever
    }
  }
  return out;
}

/**
 * The layout's key: which block states to name, given the bytes in each of allocated,
 * lost to rounding and cached free. Allocated and cached free always; rounding only where
 * some block has any (a key never names what the picture cannot show).
 */
export function layoutKeys(bytes: {
  allocated: number;
  rounding: number;
  cached: number;
}): Array<'allocated' | 'rounding' | 'cached'> {
  const keys: Array<'allocated' | 'rounding' | 'cached'> = ['allocated'];
  if (bytes.rounding > 0) {
    keys.push('rounding');
  }
  keys.push('cached');
  return keys;
}
