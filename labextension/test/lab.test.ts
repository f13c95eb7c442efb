// The GPU memory panel's and the badges' pure parts: the schema's readers, the session's
// series, the badge's words, the table's rows and sorting, a device's parts.
import { describe, expect, it } from 'vitest';
import { badgeText, badgeTip, hadOom, isStale, recordText } from '../src/lab/badgeText';
import { cellRows, COLUMNS, nextSort, sortRows, totals } from '../src/lab/cellRows';
import { deviceParts, deviceTitle } from '../src/lab/deviceParts';
import {
  type BadgeRecord,
  type CellBadge,
  LAB_SCHEMA,
  readBadge,
  readMessage,
  readNotebookRecord,
  type SampleRow
} from '../src/lab/schema';
import { cutBack, keepExtremes, peakIndex, SessionSeries, spanAt, toSamples, withTail } from '../src/lab/series';
import { peakSample } from '../src/views/timeMarks';

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

function record(over: Partial<BadgeRecord> = {}): BadgeRecord {
  return {
    source: 'cupy',
    device: 0,
    device_name: 'Simulated GPU 0',
    allocated_delta: 1.2 * GiB,
    reserved_delta: 2 * GiB,
    peak_allocated: 3.4 * GiB,
    peak_exact: true,
    ooms: 0,
    holders: 'x (1.2 GiB)',
    wall_s: 0.25,
    ...over
  };
}

function badge(records: BadgeRecord[], count = 5): CellBadge {
  return { version: LAB_SCHEMA, execution_count: count, records };
}

describe('the badge', () => {
  it('reads +Δallocated · peak, as the issue shows it', () => {
    expect(recordText(record())).toBe('+1.2 GiB · peak 3.4 GiB');
    expect(badgeText(badge([record()]))).toBe('+1.2 GiB · peak 3.4 GiB');
  });

  it('says a bound, a shrink, and an OOM', () => {
    expect(recordText(record({ peak_exact: false, allocated_delta: -512 * MiB, ooms: 2 }))).toBe(
      '-512 MiB · peak ≤ 3.4 GiB · 2 OOMs'
    );
    expect(recordText(record({ allocated_delta: 0, ooms: 1 }))).toBe('0 B · peak 3.4 GiB · 1 OOM');
    expect(hadOom(badge([record(), record({ source: 'torch', ooms: 1 })]))).toBe(true);
    expect(hadOom(badge([record()]))).toBe(false);
  });

  it('names each source when there are several', () => {
    const b = badge([record(), record({ source: 'torch', allocated_delta: 64 * MiB, peak_allocated: 64 * MiB })]);
    expect(badgeText(b)).toBe('cupy +1.2 GiB · peak 3.4 GiB  |  torch +64.0 MiB · peak 64.0 MiB');
  });

  it('is stale when the cell ran since', () => {
    expect(isStale(badge([record()], 5), 5)).toBe(false);
    expect(isStale(badge([record()], 5), 6)).toBe(true);
    expect(isStale(badge([record()], 5), null)).toBe(true);
  });

  it('has a tooltip naming the holders, the OOM, and an older run', () => {
    const tip = badgeTip(badge([record({ ooms: 1 })], 5), 7);
    expect(tip.split('\n')).toEqual([
      'GPU memory of cell [5]',
      '',
      'cupy · device 0, Simulated GPU 0',
      'Δ allocated +1.2 GiB · peak 3.4 GiB · Δ reserved +2.0 GiB · 0.250 s',
      'held by x (1.2 GiB)',
      '1 OOM: out of memory while the cell ran',
      '',
      '(of run [5]: the cell has run since with no GPU memory record)'
    ]);
    expect(badgeTip(badge([record({ holders: '' })]), 5)).toContain('left nothing allocated behind');
  });
});

describe('readBadge', () => {
  it('takes a badge of this version, filling optional words', () => {
    const raw = { version: 1, execution_count: 3, records: [{ source: 'cupy', allocated_delta: 1, reserved_delta: 2, peak_allocated: 3, ooms: 0 }] };
    expect(readBadge(raw)).toEqual({
      version: 1,
      execution_count: 3,
      records: [{ source: 'cupy', device: 0, device_name: '', allocated_delta: 1, reserved_delta: 2, peak_allocated: 3, peak_exact: true, ooms: 0, holders: '', wall_s: 0 }]
    });
  });

  it('passes over anything else', () => {
    for (const v of [null, 'x', [], {}, { version: 2, execution_count: 1, records: [record()] }, { version: 1, records: [record()] }, { version: 1, execution_count: 1, records: [{ source: 'cupy' }] }]) {
      expect(readBadge(v)).toBeNull();
    }
  });
});

describe('readMessage', () => {
  it('checks a cell message and its rows', () => {
    const msg = readMessage({
      type: 'cell',
      cell_id: 'abc',
      msg_id: 'm1',
      badge: badge([record()]),
      span: { cell: 5, cell_id: 'abc', msg_id: 'm1', start: 1, end: 1.2 },
      lanes: { 'cupy:0': [[1, 10, 20, null], [1.2, 'bad', 20, 3], [1.2, 11, 21, 7]] }
    });
    expect(msg?.type).toBe('cell');
    if (msg?.type === 'cell') {
      expect(msg.cell_id).toBe('abc');
      expect(msg.badge?.records[0].holders).toBe('x (1.2 GiB)');
      expect(msg.lanes).toEqual({ 'cupy:0': [[1, 10, 20, null], [1.2, 11, 21, 7]] });
      expect(msg.devices).toBeUndefined();
    }
  });

  it('refuses another version, an unknown type, a cell without its span', () => {
    expect(readMessage({ type: 'state', version: 2 })).toBeNull();
    expect(readMessage({ type: 'other' })).toBeNull();
    expect(readMessage({ type: 'cell', badge: null })).toBeNull();
    expect(readMessage('state')).toBeNull();
  });

  it('reads a state with every list checked', () => {
    const msg = readMessage({
      type: 'state',
      version: 1,
      running: true,
      lanes: [{ key: 'cupy:0', source: 'cupy', device: 0, device_name: 'G', samples: [[0, 1, 2, 3]] }, { nope: 1 }],
      spans: [{ cell: 1, start: 0, end: null }],
      cells: [{ cell_id: null, msg_id: null, badge: null }],
      devices: [{ device: 0, device_name: 'G', total: 10, free: 4, sources: [{ source: 'cupy', allocated: 1, reserved: 2 }], other_processes: null, rest_of_process: 4 }],
      sources: [{ name: 'cupy', title: 'ours', history: 'history on', notes: ['n', 3], config: '' }]
    });
    expect(msg).toEqual({
      type: 'state',
      version: 1,
      running: true,
      lanes: [{ key: 'cupy:0', source: 'cupy', device: 0, device_name: 'G', samples: [[0, 1, 2, 3]] }],
      spans: [{ cell: 1, cell_id: null, msg_id: null, start: 0, end: null }],
      cells: [{ cell_id: null, msg_id: null, badge: null }],
      devices: [{ device: 0, device_name: 'G', total: 10, free: 4, sources: [{ source: 'cupy', allocated: 1, reserved: 2 }], other_processes: null, rest_of_process: 4 }],
      sources: [{ name: 'cupy', title: 'ours', history: 'history on', notes: ['n'], config: '' }]
    });
  });

  it('reads a notebook record, or nothing of another version', () => {
    expect(readNotebookRecord({ version: 1, lanes: [], spans: [], devices: [], sources: [] })).toEqual({ version: 1, lanes: [], spans: [], devices: [], sources: [] });
    expect(readNotebookRecord({ version: 9 })).toBeNull();
  });
});

function rows(n: number, f: (i: number) => [number, number]): SampleRow[] {
  return Array.from({ length: n }, (_, i) => [i, ...f(i), null] as SampleRow);
}

describe('the session series', () => {
  it('keeps the extremes when cut back, within the bound', () => {
    const rs = rows(10000, i => [(i * 7919) % 1000, 5000 - ((i * 104729) % 3000)]);
    rs[6543] = [6543, 99999, 1, null]; // the peak of allocated
    rs[1234] = [1234, 500, 0, null]; // the lowest reserved
    const kept = keepExtremes(rs, 400);
    expect(kept.length).toBeLessThanOrEqual(400);
    expect(kept).toContain(6543);
    expect(kept).toContain(1234);
    expect(kept[0]).toBe(0);
    expect(kept[kept.length - 1]).toBe(9999);
    expect([...kept].sort((a, b) => a - b)).toEqual(kept);
    expect(cutBack(rs, 400).map(r => r[0])).toEqual(kept);
    expect(keepExtremes(rs.slice(0, 5), 400)).toEqual([0, 1, 2, 3, 4]);
  });

  it('appends later rows, replaces one at the same time, passes over older ones', () => {
    const s = new SessionSeries();
    s.append('cupy:0', [[0, 1, 1, null], [1, 2, 2, null]]);
    s.append('cupy:0', [[0.5, 9, 9, null], [1, 3, 3, 4], [2, 5, 5, null]]);
    const [lane] = s.allLanes();
    expect(lane.key).toBe('cupy:0');
    expect(lane.source).toBe('cupy');
    expect(lane.samples).toEqual([[0, 1, 1, null], [1, 3, 3, 4], [2, 5, 5, null]]);
  });

  it('stays bounded however many rows come, keeping the peak', () => {
    const s = new SessionSeries(100);
    for (let i = 0; i < 5000; i++) {
      s.append('cupy:0', [[i, i === 2500 ? 1e9 : i % 17, 0, null]]);
    }
    const [lane] = s.allLanes();
    expect(lane.samples.length).toBeLessThanOrEqual(200);
    expect(lane.samples[peakIndex(lane.samples)][1]).toBe(1e9);
    const saved = s.saved(50, 10);
    expect(saved.lanes[0].samples.length).toBeLessThanOrEqual(50);
  });

  it('keeps a span a cell, by start, the last ones', () => {
    const s = new SessionSeries(100, 3);
    s.putSpan({ cell: 1, cell_id: 'a', msg_id: null, start: 0, end: null });
    s.putSpan({ cell: 1, cell_id: 'a', msg_id: null, start: 0, end: 0.2 });
    for (const [i, start] of [0.2, 0.4, 0.6].entries()) {
      s.putSpan({ cell: i + 2, cell_id: `c${i}`, msg_id: null, start, end: start + 0.2 });
    }
    expect(s.spans.map(x => x.cell)).toEqual([2, 3, 4]);
    expect(spanAt(s.spans, 0.45)?.cell).toBe(3);
    expect(spanAt(s.spans, 0.1)).toBeNull();
    expect(spanAt(s.spans, 9)?.cell).toBe(4);
  });

  it('holds the last reading a little to the right', () => {
    expect(withTail([])).toEqual([]);
    expect(withTail([[0, 1, 2, null], [0.2, 64, 64, 5]])).toEqual([[0, 1, 2, null], [0.2, 64, 64, 5], [0.30000000000000004, 64, 64, 5]]);
    expect(withTail([[0, 1, 1, null], [40, 2, 2, null]])[2][0]).toBe(42);
  });

  it('gives the views their samples, NaN where the device is not known', () => {
    const S = toSamples([[0, 1, 2, null], [1, 5, 6, 7]]);
    expect(S.n).toBe(2);
    expect(Array.from(S.allocated)).toEqual([1, 5]);
    expect(Number.isNaN(S.device[0])).toBe(true);
    expect(peakSample(S)).toBe(1);
  });
});

describe('the cells table', () => {
  const entries = [
    { cellId: 'a', badge: badge([record({ allocated_delta: 64 * MiB, peak_allocated: 64 * MiB, holders: 'x (64.0 MiB)' })], 2) },
    { cellId: 'b', badge: badge([record({ allocated_delta: 512 * MiB, peak_allocated: 576 * MiB, holders: '' })], 3) },
    { cellId: 'c', badge: badge([record({ allocated_delta: 0, peak_allocated: 1.1 * GiB, ooms: 1 })], 4) }
  ];

  it('has a row a record, whose columns read as sizes', () => {
    const rs = cellRows(entries);
    expect(rs.map(r => r.cell)).toEqual([2, 3, 4]);
    expect(COLUMNS.map(c => c.text(rs[1]))).toEqual(['[3]', '+512 MiB', '576 MiB', '+2.0 GiB', '–', '–']);
    expect(COLUMNS.map(c => c.text(rs[2]))[4]).toBe('1');
    expect(totals(rs)).toBe('3 cells · Δ allocated +576 MiB · highest peak 1.1 GiB · 1 OOM');
  });

  it('sorts by a column, both ways, ties in the order of the runs', () => {
    const rs = cellRows(entries);
    expect(sortRows(rs, 'peak', 'desc').map(r => r.cell)).toEqual([4, 3, 2]);
    expect(sortRows(rs, 'peak', 'asc').map(r => r.cell)).toEqual([2, 3, 4]);
    expect(sortRows(rs, 'reserved', 'desc').map(r => r.cell)).toEqual([2, 3, 4]); // all equal
    expect(sortRows(rs, 'holders', 'asc').map(r => r.cell)).toEqual([3, 4, 2]);
    expect(rs.map(r => r.cell)).toEqual([2, 3, 4]); // a copy
  });

  it('flips a column clicked again, starts sizes largest first', () => {
    expect(nextSort({ key: 'cell', dir: 'asc' }, 'peak')).toEqual({ key: 'peak', dir: 'desc' });
    expect(nextSort({ key: 'peak', dir: 'desc' }, 'peak')).toEqual({ key: 'peak', dir: 'asc' });
    expect(nextSort({ key: 'peak', dir: 'asc' }, 'cell')).toEqual({ key: 'cell', dir: 'asc' });
  });
});

describe('a device', () => {
  it('is split into the sources, the rest of the process, other processes and free', () => {
    const d = {
      device: 0,
      device_name: 'NVIDIA H200',
      total: 100 * GiB,
      free: 60 * GiB,
      sources: [
        { source: 'cupy', allocated: 10 * GiB, reserved: 20 * GiB },
        { source: 'torch', allocated: 5 * GiB, reserved: 5 * GiB }
      ],
      other_processes: 10 * GiB,
      rest_of_process: 5 * GiB
    };
    const parts = deviceParts(d);
    expect(parts.map(p => [p.kind, p.label, p.share])).toEqual([
      ['source', 'cupy (jupyter_gpumem)', 0.2],
      ['source', 'torch', 0.05],
      ['rest', 'rest of this process', 0.05],
      ['others', 'other processes', 0.1],
      ['free', 'free', 0.6]
    ]);
    expect(parts[0].detail).toBe('20.0 GiB reserved · 10.0 GiB allocated');
    expect(deviceTitle(d)).toBe('device 0 · NVIDIA H200 · 100 GiB');
  });

  it('leaves out what is not known', () => {
    const parts = deviceParts({ device: 1, device_name: '', total: null, free: null, sources: [{ source: 'jax', allocated: 1, reserved: 2 }], other_processes: null, rest_of_process: null });
    expect(parts.map(p => [p.kind, p.share])).toEqual([['source', 0]]);
  });
});
