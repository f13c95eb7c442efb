// The panel's table of cells: sortable by a click on a header, a click on a row picks the cell.
import { clear, h } from '../views/dom';
import { type CellRow, COLUMNS, nextSort, type SortDir, type SortKey, sortRows, totals } from './cellRows';

/** The table of the cells (`table.jp-GpumemPanel-cells`): a click on a header sorts, on a row picks. */
export class CellTable {
  readonly node: HTMLDivElement;
  private readonly table: HTMLTableElement;
  private readonly head: HTMLTableRowElement;
  private readonly body: HTMLTableSectionElement;
  private readonly foot: HTMLDivElement;
  private rows: CellRow[] = [];
  private sort: { key: SortKey; dir: SortDir } = { key: 'cell', dir: 'asc' };
  private selected: string | null = null;
  private showSource = false;

  constructor(private readonly onPick: (row: CellRow) => void) {
    this.head = h('tr');
    this.body = h('tbody');
    this.table = h('table', { class: 'jp-GpumemPanel-cells' }, h('thead', {}, this.head), this.body);
    this.foot = h('div', { class: 'jp-GpumemPanel-note' });
    this.node = h('div', { class: 'jp-GpumemPanel-tableWrap' }, this.table, this.foot);
    this.head.addEventListener('click', ev => {
      const th = (ev.target as HTMLElement | null)?.closest('th');
      const key = th?.dataset.key as SortKey | undefined;
      if (key) {
        this.sort = nextSort(this.sort, key);
        this.draw();
      }
    });
    this.body.addEventListener('click', ev => {
      const tr = (ev.target as HTMLElement | null)?.closest('tr');
      const row = this.rows.find(r => r.key === tr?.dataset.key);
      if (row) {
        this.select(row.key);
        this.onPick(row);
      }
    });
  }

  /** The rows to show (in the notebook's order; the table sorts them). */
  setRows(rows: CellRow[]): void {
    this.rows = rows;
    this.showSource = new Set(rows.map(r => r.record.source)).size > 1;
    this.draw();
  }

  /** Mark the row `key` (a badge's click, a row's), and bring it into view. */
  select(key: string | null): void {
    this.selected = key;
    for (const tr of Array.from(this.body.rows)) {
      const on = tr.dataset.key === key;
      tr.classList.toggle('jp-mod-selected', on);
      if (on) {
        tr.scrollIntoView({ block: 'nearest' });
      }
    }
  }

  get sortedBy(): { key: SortKey; dir: SortDir } {
    return { ...this.sort };
  }

  private draw(): void {
    clear(this.head);
    for (const col of COLUMNS) {
      const on = col.key === this.sort.key;
      const th = h(
        'th',
        {
          'data-key': col.key,
          class: col.numeric ? 'jp-mod-numeric' : null,
          'aria-sort': on ? (this.sort.dir === 'asc' ? 'ascending' : 'descending') : 'none',
          title: `Sort by ${col.label}`
        },
        col.label,
        h('span', { class: 'jp-GpumemPanel-arrow' }, on ? (this.sort.dir === 'asc' ? '▲' : '▼') : '')
      );
      this.head.append(th);
    }
    clear(this.body);
    if (this.rows.length === 0) {
      this.body.append(
        h('tr', { class: 'jp-GpumemPanel-none' }, h('td', { colspan: COLUMNS.length }, 'No cell has a GPU memory record yet.'))
      );
    }
    for (const row of sortRows(this.rows, this.sort.key, this.sort.dir)) {
      const tr = h('tr', { 'data-key': row.key, title: row.cellId ? 'Show this cell' : 'Run from outside the notebook' });
      tr.classList.toggle('jp-mod-oom', row.record.ooms > 0);
      tr.classList.toggle('jp-mod-selected', row.key === this.selected);
      COLUMNS.forEach((col, i) => {
        const text = i === 0 && this.showSource ? `${col.text(row)} ${row.record.source}` : col.text(row);
        const cls = col.numeric ? 'jp-mod-numeric' : `jp-mod-${col.key}`;
        tr.append(h('td', { class: cls, title: col.key === 'holders' && row.record.holders ? row.record.holders : null }, text));
      });
      this.body.append(tr);
    }
    this.foot.textContent = totals(this.rows);
  }
}
