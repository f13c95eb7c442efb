// Text for people: byte counts and addresses. No DOM.

/** The binary units `formatBytes` uses, smallest first (as the Python `format_bytes`). */
export const BINARY_UNITS: ReadonlyArray<readonly [string, number]> = [
  ['B', 1],
  ['KiB', 1024],
  ['MiB', 1024 ** 2],
  ['GiB', 1024 ** 3],
  ['TiB', 1024 ** 4]
];

/**
 * Python's `f"{v:.{digits}f}"` for v >= 0: the exact binary value rounded, ties to even
 * (`toFixed` breaks an exact tie upwards: 1.25 → "1.3" where Python writes "1.2").
 */
export function fixed(v: number, digits: number): string {
  const exact = v.toFixed(60); // exact: a double >= 1 has at most 52 binary fraction digits
  const dot = exact.indexOf('.');
  const rest = exact.slice(dot + 1 + digits);
  if (/^50*$/.test(rest)) {
    const kept = exact.slice(0, dot + 1 + digits).replace(/\.$/, '');
    const last = kept.charCodeAt(kept.length - 1) - 48;
    if (last % 2 === 0) {
      return kept;
    }
  }
  return v.toFixed(digits);
}

/**
 * `1536` → `"1.5 KiB"`; exact bytes below 1 KiB; sign kept; one decimal below 100 of a unit,
 * none from 100 up; TiB is the largest unit. The same text as the Python `format_bytes`.
 */
export function formatBytes(n: number): string {
  if (n === null || n === undefined || Number.isNaN(n)) {
    return '–';
  }
  const sign = n < 0 ? '-' : '';
  const a = Math.abs(n);
  if (a < 1024) {
    return `${sign}${Math.trunc(a)} B`;
  }
  for (let u = 1; u < BINARY_UNITS.length; u++) {
    const [unit, scale] = BINARY_UNITS[u];
    const value = a / scale;
    if (value < 1024 || unit === 'TiB') {
      return value < 100 ? `${sign}${fixed(value, 1)} ${unit}` : `${sign}${fixed(value, 0)} ${unit}`;
    }
  }
  throw new Error('unreachable');
}

/** A change in bytes: `"+1.5 KiB"`, `"-512 B"`, `"0 B"`. */
export function formatSignedBytes(n: number): string {
  return (n > 0 ? '+' : '') + formatBytes(n);
}

/**
 * An exact tick label, in the largest binary unit not above the value: `"0"`, `"384 MiB"`,
 * `"1.25 GiB"`.
 */
export function byteTickLabel(v: number): string {
  if (v === 0) {
    return '0';
  }
  let u = 0;
  while (u < BINARY_UNITS.length - 1 && Math.abs(v) >= BINARY_UNITS[u + 1][1]) {
    u += 1;
  }
  return `${v / BINARY_UNITS[u][1]} ${BINARY_UNITS[u][0]}`;
}

/** An address as `0x7f00…` (addresses are exact below 2**53 in a float64). */
export function hex(addr: number): string {
  if (!Number.isFinite(addr)) {
    return '?';
  }
  return `${addr < 0 ? '-' : ''}0x${Math.round(Math.abs(addr)).toString(16)}`;
}

/** A whole number with thousands separators that do not depend on the locale: `12,345`. */
export function formatCount(n: number): string {
  const s = String(Math.trunc(Math.abs(n)));
  return (n < 0 ? '-' : '') + s.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

/** One stack frame as `filename:line in name`, or `cell [3] line 4 in name` for a notebook cell
 * (the payload names a cell's frames `cell [N]`, not by its temporary file). */
export function frameText(frame: readonly [string, number, string] | unknown): string {
  if (Array.isArray(frame) && frame.length >= 3) {
    const file = String(frame[0]);
    const at = /^cell \[\d+\]$/.test(file) ? ' line ' : ':';
    return `${file}${at}${String(frame[1])} in ${String(frame[2])}`;
  }
  return String(frame);
}
