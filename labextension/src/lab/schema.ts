// What the kernel tells the GPU memory panel and the cell badges, and what a notebook keeps of
// it. The Python side, `jupyter_gpumem/data/lab_schema.py`, is the home of these shapes (a test
// reads the constants below against it). No DOM.

/** The comm target the kernel registers at `%load_ext jupyter_gpumem`. */
export const COMM_TARGET = 'jupyter_gpumem.lab';
/** The key of our metadata, in a cell's metadata and in the notebook's. */
export const METADATA_KEY = 'jupyter_gpumem';
/** Version of these shapes; anything else is passed over. */
export const LAB_SCHEMA = 1;
/** Rows a lane keeps while live, as the kernel does (the live view's bound, `MAX_POINTS`). */
export const LIVE_POINTS = 4000;
/** Rows a lane keeps in a notebook's metadata. */
export const SAVED_POINTS = 1000;
/** Cells' spans a notebook's metadata keeps (the last ones). */
export const SAVED_SPANS = 500;

/** One sample: session seconds, allocated, reserved, device used (null: unknown). */
export type SampleRow = [t: number, allocated: number, reserved: number, used: number | null];

/** What one cell did to one memory source. */
export interface BadgeRecord {
  source: string;
  device: number;
  device_name: string;
  allocated_delta: number;
  reserved_delta: number;
  peak_allocated: number;
  /** False: `peak_allocated` is only an upper bound. */
  peak_exact: boolean;
  ooms: number;
  /** Who holds what the cell left behind, as the footer says it; "" when it left nothing. */
  holders: string;
  wall_s: number;
}

/** A cell's `metadata.jupyter_gpumem`: what its last run did to GPU memory. */
export interface CellBadge {
  version: number;
  /** The run it is of: a badge of an older run than the cell's shows dimmed. */
  execution_count: number;
  records: BadgeRecord[];
}

/** The sampled series of one memory source on one device. */
export interface Lane {
  /** `"cupy:0"`. */
  key: string;
  source: string;
  device: number;
  device_name: string;
  samples: SampleRow[];
}

/** Where one cell ran on the session's time axis (seconds spent running cells). */
export interface CellSpan {
  cell: number;
  cell_id: string | null;
  msg_id: string | null;
  start: number;
  end: number | null;
}

export interface SourceUse {
  source: string;
  allocated: number;
  reserved: number;
}

/** Where a device's memory is. */
export interface DeviceUse {
  device: number;
  device_name: string;
  total: number | null;
  free: number | null;
  sources: SourceUse[];
  other_processes: number | null;
  rest_of_process: number | null;
}

export interface SourceInfo {
  name: string;
  title: string;
  history: string;
  notes: string[];
  config: string | null;
}

/** A cell's badge and the cell it is for. */
export interface CellEntry {
  cell_id: string | null;
  msg_id: string | null;
  badge: CellBadge | null;
}

export interface StateMessage {
  type: 'state';
  version: number;
  running: boolean;
  lanes: Lane[];
  spans: CellSpan[];
  cells: CellEntry[];
  devices: DeviceUse[];
  sources: SourceInfo[];
}

export interface SamplesMessage {
  type: 'samples';
  lanes: Record<string, SampleRow[]>;
  new_lanes?: Lane[];
}

export interface CellMessage extends CellEntry {
  type: 'cell';
  span: CellSpan;
  lanes?: Record<string, SampleRow[]>;
  new_lanes?: Lane[];
  devices?: DeviceUse[];
  sources?: SourceInfo[];
}

export type KernelMessage = StateMessage | SamplesMessage | CellMessage;

/** The notebook's `metadata.jupyter_gpumem`: the panel's view of the last session. */
export interface NotebookRecord {
  version: number;
  lanes: Lane[];
  spans: CellSpan[];
  devices: DeviceUse[];
  sources: SourceInfo[];
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const isNumber = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);

function isRecord(v: unknown): v is BadgeRecord {
  return (
    isObject(v) &&
    typeof v.source === 'string' &&
    isNumber(v.allocated_delta) &&
    isNumber(v.reserved_delta) &&
    isNumber(v.peak_allocated) &&
    isNumber(v.ooms)
  );
}

/**
 * A cell's metadata value as a badge, or null when it is none of this version (absent, another
 * version, or not the shape). Missing optional words are filled in.
 */
export function readBadge(value: unknown): CellBadge | null {
  if (!isObject(value) || value.version !== LAB_SCHEMA || !isNumber(value.execution_count)) {
    return null;
  }
  const records = Array.isArray(value.records) ? value.records.filter(isRecord) : [];
  if (records.length === 0) {
    return null;
  }
  return {
    version: LAB_SCHEMA,
    execution_count: value.execution_count,
    records: records.map(r => ({
      source: r.source,
      device: isNumber(r.device) ? r.device : 0,
      device_name: typeof r.device_name === 'string' ? r.device_name : '',
      allocated_delta: r.allocated_delta,
      reserved_delta: r.reserved_delta,
      peak_allocated: r.peak_allocated,
      peak_exact: r.peak_exact !== false,
      ooms: r.ooms,
      holders: typeof r.holders === 'string' ? r.holders : '',
      wall_s: isNumber(r.wall_s) ? r.wall_s : 0
    }))
  };
}

function readRows(rows: unknown): SampleRow[] {
  if (!Array.isArray(rows)) {
    return [];
  }
  const out: SampleRow[] = [];
  for (const r of rows) {
    if (Array.isArray(r) && r.length >= 3 && isNumber(r[0]) && isNumber(r[1]) && isNumber(r[2])) {
      out.push([r[0], r[1], r[2], isNumber(r[3]) ? r[3] : null]);
    }
  }
  return out;
}

/** A lane as sent or saved, or null. */
export function readLane(v: unknown): Lane | null {
  if (!isObject(v) || typeof v.key !== 'string' || typeof v.source !== 'string') {
    return null;
  }
  return {
    key: v.key,
    source: v.source,
    device: isNumber(v.device) ? v.device : 0,
    device_name: typeof v.device_name === 'string' ? v.device_name : '',
    samples: readRows(v.samples)
  };
}

/** Rows by lane key, as a samples or cell message carries them. */
export function readLaneRows(v: unknown): Record<string, SampleRow[]> {
  const out: Record<string, SampleRow[]> = {};
  if (isObject(v)) {
    for (const [key, rows] of Object.entries(v)) {
      out[key] = readRows(rows);
    }
  }
  return out;
}

export function readSpan(v: unknown): CellSpan | null {
  if (!isObject(v) || !isNumber(v.cell) || !isNumber(v.start)) {
    return null;
  }
  return {
    cell: v.cell,
    cell_id: typeof v.cell_id === 'string' ? v.cell_id : null,
    msg_id: typeof v.msg_id === 'string' ? v.msg_id : null,
    start: v.start,
    end: isNumber(v.end) ? v.end : null
  };
}

const list = <T>(v: unknown, read: (x: unknown) => T | null): T[] =>
  Array.isArray(v) ? v.map(read).filter((x): x is T => x !== null) : [];

function readDevice(v: unknown): DeviceUse | null {
  if (!isObject(v) || !isNumber(v.device)) {
    return null;
  }
  const num = (x: unknown): number | null => (isNumber(x) ? x : null);
  return {
    device: v.device,
    device_name: typeof v.device_name === 'string' ? v.device_name : '',
    total: num(v.total),
    free: num(v.free),
    sources: list(v.sources, s =>
      isObject(s) && typeof s.source === 'string' && isNumber(s.allocated) && isNumber(s.reserved)
        ? { source: s.source, allocated: s.allocated, reserved: s.reserved }
        : null
    ),
    other_processes: num(v.other_processes),
    rest_of_process: num(v.rest_of_process)
  };
}

function readSource(v: unknown): SourceInfo | null {
  if (!isObject(v) || typeof v.name !== 'string') {
    return null;
  }
  return {
    name: v.name,
    title: typeof v.title === 'string' ? v.title : v.name,
    history: typeof v.history === 'string' ? v.history : '',
    notes: Array.isArray(v.notes) ? v.notes.filter((n): n is string => typeof n === 'string') : [],
    config: typeof v.config === 'string' ? v.config : null
  };
}

export const readDevices = (v: unknown): DeviceUse[] => list(v, readDevice);
export const readSources = (v: unknown): SourceInfo[] => list(v, readSource);

/** A message from the kernel, checked; null for anything else (a newer kernel's, say). */
export function readMessage(data: unknown): KernelMessage | null {
  if (!isObject(data)) {
    return null;
  }
  switch (data.type) {
    case 'state':
      if (data.version !== LAB_SCHEMA) {
        return null;
      }
      return {
        type: 'state',
        version: LAB_SCHEMA,
        running: data.running === true,
        lanes: list(data.lanes, readLane),
        spans: list(data.spans, readSpan),
        cells: list(data.cells, readEntry),
        devices: readDevices(data.devices),
        sources: readSources(data.sources)
      };
    case 'samples':
      return { type: 'samples', lanes: readLaneRows(data.lanes), new_lanes: list(data.new_lanes, readLane) };
    case 'cell': {
      const span = readSpan(data.span);
      const entry = readEntry(data);
      if (!span || !entry) {
        return null;
      }
      return {
        type: 'cell',
        ...entry,
        span,
        lanes: readLaneRows(data.lanes),
        new_lanes: list(data.new_lanes, readLane),
        devices: data.devices === undefined ? undefined : readDevices(data.devices),
        sources: data.sources === undefined ? undefined : readSources(data.sources)
      };
    }
    default:
      return null;
  }
}

function readEntry(v: unknown): CellEntry | null {
  if (!isObject(v)) {
    return null;
  }
  return {
    cell_id: typeof v.cell_id === 'string' ? v.cell_id : null,
    msg_id: typeof v.msg_id === 'string' ? v.msg_id : null,
    badge: readBadge(v.badge)
  };
}

/** The notebook's metadata value as a record, or null. */
export function readNotebookRecord(value: unknown): NotebookRecord | null {
  if (!isObject(value) || value.version !== LAB_SCHEMA) {
    return null;
  }
  return {
    version: LAB_SCHEMA,
    lanes: list(value.lanes, readLane),
    spans: list(value.spans, readSpan),
    devices: readDevices(value.devices),
    sources: readSources(value.sources)
  };
}
