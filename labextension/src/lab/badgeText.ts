// The words of a cell's badge and of its tooltip, from its metadata. No DOM.
import { formatBytes, formatSignedBytes } from '../format';
import type { BadgeRecord, CellBadge } from './schema';

/** `peak 3.4 GiB`, or `peak ≤ 3.4 GiB` when only a bound is known. */
export function peakText(r: BadgeRecord): string {
  return `peak ${r.peak_exact ? '' : '≤ '}${formatBytes(r.peak_allocated)}`;
}

/** `1 OOM`, `2 OOMs`. */
export function oomText(n: number): string {
  return `${n} OOM${n === 1 ? '' : 's'}`;
}

/** One source's part of a badge: `+1.2 GiB · peak 3.4 GiB`, `· 1 OOM` when it had one. */
export function recordText(r: BadgeRecord): string {
  const parts = [formatSignedBytes(r.allocated_delta), peakText(r)];
  if (r.ooms > 0) {
    parts.push(oomText(r.ooms));
  }
  return parts.join(' · ');
}

/** The badge's line: one record alone, or each named by its source (`cupy +64.0 MiB · ...`). */
export function badgeText(b: CellBadge): string {
  if (b.records.length === 1) {
    return recordText(b.records[0]);
  }
  return b.records.map(r => `${r.source} ${recordText(r)}`).join('  |  ');
}

/** Whether any source had an out-of-memory error in the cell. */
export function hadOom(b: CellBadge): boolean {
  return b.records.some(r => r.ooms > 0);
}

/** Whether the badge is of an older run than the cell's (`count`: the cell's execution count). */
export function isStale(b: CellBadge, count: number | null | undefined): boolean {
  return count !== b.execution_count;
}

function where(r: BadgeRecord): string {
  const device = `device ${r.device}${r.device_name ? `, ${r.device_name}` : ''}`;
  return `${r.source} · ${device}`;
}

/** The badge's tooltip: per source, its numbers and who holds what the cell left. */
export function badgeTip(b: CellBadge, count?: number | null): string {
  const lines = [`GPU memory of cell [${b.execution_count}]`];
  for (const r of b.records) {
    lines.push(
      '',
      where(r),
      `Δ allocated ${formatSignedBytes(r.allocated_delta)} · ${peakText(r)} · ` +
        `Δ reserved ${formatSignedBytes(r.reserved_delta)} · ${r.wall_s.toFixed(3)} s`,
      r.holders ? `held by ${r.holders}` : 'left nothing allocated behind'
    );
    if (r.ooms > 0) {
      lines.push(`${oomText(r.ooms)}: out of memory while the cell ran`);
    }
  }
  if (count !== undefined && isStale(b, count)) {
    lines.push('', `(of run [${b.execution_count}]: the cell has run since with no GPU memory record)`);
  }
  return lines.join('\n');
}
