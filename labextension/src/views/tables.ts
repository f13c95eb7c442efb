// The tables: top allocation sites at the peak, and the blocks the traced code left live.
import { formatBytes, formatCount, hex } from '../format';
import type { ViewPayload } from '../payload';
import { h } from './dom';

function table(cls: string, caption: string, head: string[], rows: string[][], empty: string): HTMLTableElement {
  const t = h('table', { class: cls });
  t.append(h('caption', {}, caption));
  t.append(h('thead', {}, h('tr', {}, ...head.map(c => h('th', {}, c)))));
  const body = h('tbody');
  if (rows.length === 0) {
    body.append(h('tr', { class: 'gm-none' }, h('td', { colspan: head.length }, empty)));
  }
  for (const r of rows) {
    body.append(h('tr', {}, ...r.map(c => h('td', {}, c))));
  }
  t.append(body);
  return t;
}

/** table.gm-sites: where the bytes live at the peak came from. */
export function sitesTable(p: ViewPayload): HTMLTableElement {
  const rows = (p.top_sites ?? []).map(r => [String(r.site), formatBytes(Number(r.bytes)), formatCount(Number(r.count))]);
  return table('gm-sites', 'Top allocation sites at the peak', ['site', 'bytes', 'blocks'], rows, 'no allocation live at the peak');
}

/** table.gm-surviving: blocks the traced code left allocated, with what holds them. */
export function survivingTable(p: ViewPayload): HTMLTableElement {
  const rows = (p.surviving ?? []).map(r => [
    hex(Number(r.address)),
    formatBytes(Number(r.size)),
    formatBytes(Number(r.requested)),
    r.site === null || r.site === undefined ? '–' : String(r.site),
    (r.holders ?? []).map(String).join(', ') || '–'
  ]);
  return table(
    'gm-surviving',
    'Blocks still allocated at the end',
    ['address', 'size', 'requested', 'site', 'held by'],
    rows,
    'none: everything the traced code allocated was freed'
  );
}
