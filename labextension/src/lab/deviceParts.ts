// The parts of a device's bar: the sources read (ours and other libraries'), the rest of this
// process, other processes, free. No DOM.
import { formatBytes } from '../format';
import type { DeviceUse } from './schema';

export interface DevicePart {
  /** Which kind of part: a CSS class suffix. */
  kind: 'source' | 'rest' | 'others' | 'free';
  label: string;
  bytes: number;
  /** Its share of the device's total, 0..1 (0 when the total is unknown). */
  share: number;
  /** The words beside it: `1.2 GiB (allocated 1.0 GiB)`. */
  detail: string;
}

/** The parts of `d`, in the bar's order; a part of unknown size is left out. */
export function deviceParts(d: DeviceUse): DevicePart[] {
  const total = d.total ?? 0;
  const share = (b: number): number => (total > 0 ? Math.max(0, b) / total : 0);
  const parts: DevicePart[] = d.sources.map(s => ({
    kind: 'source',
    label: s.source === 'cupy' ? 'cupy (jupyter_gpumem)' : s.source,
    bytes: s.reserved,
    share: share(s.reserved),
    detail: `${formatBytes(s.reserved)} reserved · ${formatBytes(s.allocated)} allocated`
  }));
  if (d.rest_of_process !== null) {
    parts.push({
      kind: 'rest',
      label: 'rest of this process',
      bytes: d.rest_of_process,
      share: share(d.rest_of_process),
      detail: `${formatBytes(d.rest_of_process)} (CUDA context, libraries not read)`
    });
  }
  if (d.other_processes !== null) {
    parts.push({
      kind: 'others',
      label: 'other processes',
      bytes: d.other_processes,
      share: share(d.other_processes),
      detail: formatBytes(d.other_processes)
    });
  }
  if (d.free !== null) {
    parts.push({ kind: 'free', label: 'free', bytes: d.free, share: share(d.free), detail: formatBytes(d.free) });
  }
  return parts;
}

/** `device 0 · Simulated GPU 0 · 80.0 GiB`. */
export function deviceTitle(d: DeviceUse): string {
  return [`device ${d.device}`, d.device_name, d.total !== null ? formatBytes(d.total) : ''].filter(Boolean).join(' · ');
}
