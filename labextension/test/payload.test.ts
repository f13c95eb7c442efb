import { describe, expect, it } from 'vitest';
import { base64Bytes, bytesOf, decodeColumn, decodeLives, decodePayload, decodeSamples } from '../src/payload';
import { livesPayload, TRACE_BLOCKS, TRACE_SEGS, tracePayload } from './helpers';

describe('decodeColumn', () => {
  const values = [0, 1.5, -2, 2 ** 52 + 1, 0x7f0000001000];
  const f8 = new Float64Array(values);
  const b64 = Buffer.from(new Uint8Array(f8.buffer)).toString('base64');

  it('reads the same floats from base64, DataView, ArrayBuffer and a typed array', () => {
    const fromB64 = Array.from(decodeColumn({ dtype: 'f8', data: b64 }));
    expect(fromB64).toEqual(values);
    expect(Array.from(decodeColumn({ dtype: 'f8', data: new DataView(f8.buffer) }))).toEqual(values);
    expect(Array.from(decodeColumn({ dtype: 'f8', data: f8.buffer }))).toEqual(values);
    expect(Array.from(decodeColumn({ dtype: 'f8', data: new Uint8Array(f8.buffer) }))).toEqual(values);
  });

  it('reads a column that starts at an odd offset of its buffer (copied, so aligned)', () => {
    const raw = new Uint8Array(3 + 8 * 2);
    raw.set(new Uint8Array(new Float64Array([7, 8]).buffer), 3);
    const view = new DataView(raw.buffer, 3, 16);
    expect(Array.from(decodeColumn({ dtype: 'f8', data: view }))).toEqual([7, 8]);
  });

  it('reads int32 and uint8 columns, little-endian', () => {
    const i4 = Buffer.from([0xff, 0xff, 0xff, 0xff, 0x02, 0x00, 0x00, 0x00]).toString('base64');
    expect(Array.from(decodeColumn({ dtype: 'i4', data: i4 }))).toEqual([-1, 2]);
    expect(Array.from(decodeColumn({ dtype: 'u1', data: 'AQAB' }))).toEqual([1, 0, 1]);
  });

  it('refuses a column of partial items and an unknown dtype', () => {
    expect(() => decodeColumn({ dtype: 'f8', data: new Uint8Array(12) })).toThrow(TypeError);
    expect(() => decodeColumn({ dtype: 'x' as 'f8', data: '' })).toThrow(TypeError);
  });
});

describe('base64Bytes', () => {
  it('agrees with Buffer on every tail length, padded or not, and URL-safe', () => {
    for (let n = 0; n < 10; n++) {
      const bytes = Uint8Array.from({ length: n }, (_, i) => (i * 97 + 250) & 0xff);
      const text = Buffer.from(bytes).toString('base64');
      expect(Array.from(base64Bytes(text))).toEqual(Array.from(bytes));
      expect(Array.from(base64Bytes(text.replace(/=+$/, '')))).toEqual(Array.from(bytes));
      expect(Array.from(base64Bytes(Buffer.from(bytes).toString('base64url')))).toEqual(Array.from(bytes));
    }
  });
  it('refuses other characters', () => {
    expect(() => base64Bytes('ab$d')).toThrow(/not base64/);
  });
  it('copies binary data rather than keeping a view of it', () => {
    const a = new Uint8Array([1, 2]);
    const b = bytesOf(a);
    a[0] = 9;
    expect(b[0]).toBe(1);
  });
});

describe('decodePayload', () => {
  it('decodes the same view from base64 and from binary columns', () => {
    const a = decodePayload(tracePayload('base64'));
    const b = decodePayload(tracePayload('binary'));
    expect(a.nEvents).toBe(6);
    expect(Array.from(a.timeline.allocated)).toEqual(Array.from(b.timeline.allocated));
    expect(a.timeline.bands.map(x => Array.from(x))).toEqual(b.timeline.bands.map(x => Array.from(x)));
    for (const k of ['start', 'end', 'addr', 'size', 'requested', 'stack', 'site', 'cell'] as const) {
      expect(Array.from(a.lives.blocks[k])).toEqual(Array.from(b.lives.blocks[k]));
    }
    expect(Array.from(a.lives.blocks.requested)).toEqual(TRACE_BLOCKS.map(x => x.requested ?? x.size));
    expect(Array.from(a.lives.segments.small)).toEqual([0, 1]);
    expect(a.lives.blocks.n).toBe(5);
    expect(a.lives.segments.n).toBe(2);
  });

  it('refuses another schema and columns of different lengths', () => {
    expect(() => decodePayload({ ...tracePayload(), schema: 1 as 2 })).toThrow(/schema/);
    const p = tracePayload('binary');
    p.timeline.reserved = { dtype: 'f8', data: new Float64Array([1]) };
    expect(() => decodePayload(p)).toThrow(/timeline/);
    const lives = livesPayload(TRACE_BLOCKS, TRACE_SEGS);
    lives.blocks.size = { dtype: 'f8', data: new Float64Array([1]) };
    expect(() => decodeLives(lives)).toThrow(/lives.blocks.size/);
  });

  it('decodes samples as n rows of 4', () => {
    const rows = new Float64Array([0, 10, 20, NaN, 0.2, 11, 21, 99]);
    const s = decodeSamples(rows, 2);
    expect(s.n).toBe(2);
    expect(Array.from(s.t)).toEqual([0, 0.2]);
    expect(Array.from(s.allocated)).toEqual([10, 11]);
    expect(Array.from(s.reserved)).toEqual([20, 21]);
    expect(Number.isNaN(s.device[0])).toBe(true);
    expect(decodeSamples(rows, 5).n).toBe(2); // never more rows than the data holds
    const p = { ...tracePayload(), kind: 'live' as const, samples: { n: 2, data: { dtype: 'f8' as const, data: Buffer.from(new Uint8Array(rows.buffer)).toString('base64') } } };
    expect(Array.from(decodePayload(p).samples.reserved)).toEqual([20, 21]);
  });
});
