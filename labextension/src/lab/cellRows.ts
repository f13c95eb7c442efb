// The panel's table of cells: a row a cell and memory source, its columns, and sorting. No DOM.
import { formatBytes, formatSignedBytes } from '../format';
import { oomText, peakText } from './badgeText';
import type { BadgeRecord, CellBadge } from './schema';

/** One row: a cell's record of one source. */
export interface CellRow {
  /** Unique in the table: the cell's id (or its run) and the source. */
  key: string;
  cellId: string | null;
  /** The cell's execution count. */
  cell: number;
  record: BadgeRecord;
}

export type SortKey = 'cell' | 'allocated' | 'peak' | 'reserved' | 'holders' | 'ooms';
export type SortDir = 'asc' | 'desc';

export interface Column {
  key: SortKey;
  label: string;
  /** What a click on the header sorts by first: sizes largest first, the cell in order. */
  firstDir: SortDir;
  numeric: boolean;
  text(r: CellRow): string;
  value(r: CellRow): number | string;
}

export const COLUMNS: readonly Column[] = [
  { key: 'cell', label: 'cell', firstDir: 'asc', numeric: true, text: r => `[${r.cell}]`, value: r => r.cell },
  {
    key: 'allocated',
    label: 'Δ allocated',
    firstDir: 'desc',
    numeric: true,
    text: r => formatSignedBytes(r.record.allocated_delta),
    value: r => r.record.allocated_delta
  },
  {
    key: 'peak',
    label: 'peak',
    firstDir: 'desc',
    numeric: true,
    text: r => peakText(r.record).slice('peak '.length),
    value: r => r.record.peak_allocated
  },
  {
    key: 'reserved',
    label: 'Δ reserved',
    firstDir: 'desc',
    numeric: true,
    text: r => formatSignedBytes(r.record.reserved_delta),
    value: r => r.record.reserved_delta
  },
  {
    key: 'ooms',
    label: 'OOMs',
    firstDir: 'desc',
    numeric: true,
    text: r => (r.record.ooms > 0 ? String(r.record.ooms) : '–'),
    value: r => r.record.ooms
  },
  { key: 'holders', label: 'held by', firstDir: 'asc', numeric: false, text: r => r.record.holders || '–', value: r => r.record.holders }
];

/** Rows of the badges given, in the order given (one a record). */
export function cellRows(badges: ReadonlyArray<{ cellId: string | null; badge: CellBadge }>): CellRow[] {
  const rows: CellRow[] = [];
  for (const { cellId, badge } of badges) {
    for (const record of badge.records) {
      rows.push({
        key: `${cellId ?? `run ${badge.execution_count}`}:${record.source}:${record.device}`,
        cellId,
        cell: badge.execution_count,
        record
      });
    }
  }
  return rows;
}

/**
 * `rows` sorted by column `key` in `dir`, a copy; ties (and a row whose value is equal) keep
 * the order of the cells' runs.
 */
export function sortRows(rows: readonly CellRow[], key: SortKey, dir: SortDir): CellRow[] {
  const col = COLUMNS.find(c => c.key === key) ?? COLUMNS[0];
  const sign = dir === 'asc' ? 1 : -1;
  return rows
    .map((r, i) => ({ r, i }))
    .sort((a, b) => {
      const va = col.value(a.r);
      const vb = col.value(b.r);
      const by = typeof va === 'number' && typeof vb === 'number' ? va - vb : String(va).localeCompare(String(vb));
      return by !== 0 ? sign * by : a.r.cell - b.r.cell || a.i - b.i;
    })
    .map(x => x.r);
}

/** The direction a header click gives: the column's first direction, or the other one when it
 * is the column sorted now. */
export function nextSort(current: { key: SortKey; dir: SortDir }, clicked: SortKey): { key: SortKey; dir: SortDir } {
  const col = COLUMNS.find(c => c.key === clicked) ?? COLUMNS[0];
  if (current.key === clicked) {
    return { key: clicked, dir: current.dir === 'asc' ? 'desc' : 'asc' };
  }
  return { key: clicked, dir: col.firstDir };
}

/** A total line under the table: the cells' Δallocated summed, the highest peak. */
export function totals(rows: readonly CellRow[]): string {
  if (rows.length === 0) {
    return '';
  }
  const delta = rows.reduce((s, r) => s + r.record.allocated_delta, 0);
  const peak = Math.max(...rows.map(r => r.record.peak_allocated));
  const ooms = rows.reduce((s, r) => s + r.record.ooms, 0);
  const cells = new Set(rows.map(r => r.cellId ?? `run ${r.cell}`)).size;
  return (
    `${cells} cell${cells === 1 ? '' : 's'} · Δ allocated ${formatSignedBytes(delta)} · highest peak ${formatBytes(peak)}` +
    (ooms ? ` · ${oomText(ooms)}` : '')
  );
}
