// The tables: top allocation sites at the peak, and the blocks the traced code left live.
import { formatBytes, formatCount, hex } from '../format';
import type { ViewPayload } from '../payload';
import { h } from './dom';

function table(cls: string, caption: string, head: string[], rows: string[][], empty: string, more = ''): HTMLTableElement {
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
  if (more) {
    body.append(h('tr', { class: 'gm-more' }, h('td', { colspan: head.length }, more)));
  }
  t.append(body);
  return t;
}

/** table.gm-sites: where the bytes live at the peak came from. */
export function sitesTable(p: ViewPayload): HTMLTableElement {
  const rows = (p.top_sites ?? []).map(r => [String(r.site), formatBytes(Number(r.bytes)), formatCount(Number(r.count))]);
  // a snapshot without events has one moment, now; a trace has a peak
  const when = p.n_events > 0 ? 'at the peak' : 'now';
  return table('gm-sites', `Top allocation sites ${when}`, ['site', 'bytes', 'blocks'], rows, `no allocation live ${when}`);
}

/** table.gm-surviving: blocks the traced code left allocated, with what holds them. */
export function survivingTable(p: ViewPayload): HTMLTableElement {
  const all = p.surviving ?? []; // largest first
  const shown = all.slice(0, SHOWN_SURVIVORS);
  const rest = all.slice(SHOWN_SURVIVORS);
  const rows = shown.map(r => [
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
    'none: everything the traced code allocated was freed',
    moreLine(rest, p.surviving_rest ?? null)
  );
}

/** Rows shown in the survivors' table; the rest are summed up in one line. */
export const SHOWN_SURVIVORS = 10;

/**
 * The line under the listed survivors: those past SHOWN_SURVIVORS, with the ones the payload
 * did not list at all (`unlisted`: their count, bytes and most common site).
 */
function moreLine(rest: NonNullable<ViewPayload['surviving']>, unlisted: ViewPayload['surviving_rest']): string {
  const bySite = new Map<string, number>();
  let count = 0;
  let bytes = 0;
  for (const r of rest) {
    const site = r.site === null || r.site === undefined ? '(no stack)' : String(r.site);
    bySite.set(site, (bySite.get(site) ?? 0) + 1);
    count += 1;
    bytes += Number(r.size);
  }
  if (unlisted && Number(unlisted.count) > 0) {
    const site = String(unlisted.site);
    bySite.set(site, (bySite.get(site) ?? 0) + Number(unlisted.at_site));
    count += Number(unlisted.count);
    bytes += Number(unlisted.bytes);
  }
  if (count === 0) {
    return '';
  }
  const [site, most] = [...bySite.entries()].sort((a, b) => b[1] - a[1])[0];
  const where = most === count ? `all at ${site}` : `${formatCount(most)} at ${site}`;
  return `… and ${formatCount(count)} more blocks, ${formatBytes(bytes)} (${where})`;
}
