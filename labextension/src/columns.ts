// The payload's columns: little-endian bytes, binary or base64, read as typed arrays. No DOM.

/** Raw column data: binary (a widget buffer) or base64 text of the same little-endian bytes. */
export type ColumnData = DataView | ArrayBuffer | ArrayBufferView | string;

export interface Column {
  dtype: 'f8' | 'i4' | 'u1';
  data: ColumnData;
}

export type Typed = Float64Array | Int32Array | Uint8Array;

/** The bytes of `data`, copied into a fresh (so aligned) buffer. */
export function bytesOf(data: ColumnData | null | undefined): Uint8Array {
  if (data === null || data === undefined) {
    return new Uint8Array(0);
  }
  if (typeof data === 'string') {
    return base64Bytes(data);
  }
  if (data instanceof ArrayBuffer) {
    return new Uint8Array(data.slice(0));
  }
  if (ArrayBuffer.isView(data)) {
    return new Uint8Array(data.buffer, data.byteOffset, data.byteLength).slice();
  }
  throw new TypeError(`not column data: ${Object.prototype.toString.call(data)}`);
}

const B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
const B64_INDEX = (() => {
  const t = new Int16Array(128).fill(-1);
  for (let i = 0; i < B64.length; i++) {
    t[B64.charCodeAt(i)] = i;
  }
  t['-'.charCodeAt(0)] = 62; // the URL-safe alphabet too
  t['_'.charCodeAt(0)] = 63;
  return t;
})();

/** Decode base64 (standard or URL-safe, padding optional, whitespace ignored). */
export function base64Bytes(text: string): Uint8Array {
  const clean = text.replace(/[\s=]+/g, '');
  const out = new Uint8Array(Math.floor((clean.length * 3) / 4));
  let bits = 0;
  let acc = 0;
  let o = 0;
  for (let i = 0; i < clean.length; i++) {
    const c = clean.charCodeAt(i);
    const v = c < 128 ? B64_INDEX[c] : -1;
    if (v < 0) {
      throw new TypeError(`not base64: character ${JSON.stringify(clean[i])} at ${i}`);
    }
    acc = (acc << 6) | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[o++] = (acc >> bits) & 0xff;
    }
  }
  return out.subarray(0, o);
}

/** A column as its typed array (little-endian, as the payload stores it). */
export function decodeColumn(col: Column | null | undefined): Typed {
  if (!col) {
    return new Float64Array(0);
  }
  const bytes = bytesOf(col.data);
  switch (col.dtype) {
    case 'f8':
      return littleEndian(bytes, 8, (v, o) => v.getFloat64(o, true), Float64Array);
    case 'i4':
      return littleEndian(bytes, 4, (v, o) => v.getInt32(o, true), Int32Array);
    case 'u1':
      return bytes;
    default:
      throw new TypeError(`unknown column dtype ${JSON.stringify((col as Column).dtype)}`);
  }
}

const LITTLE = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

function littleEndian<T extends Float64Array | Int32Array>(
  bytes: Uint8Array,
  width: number,
  read: (v: DataView, o: number) => number,
  Ctor: { new (b: ArrayBuffer, o: number, n: number): T; new (n: number): T }
): T {
  if (bytes.byteLength % width !== 0) {
    throw new TypeError(`a column of ${bytes.byteLength} bytes is not whole ${width}-byte items`);
  }
  const n = bytes.byteLength / width;
  if (LITTLE) {
    return new Ctor(bytes.buffer as ArrayBuffer, bytes.byteOffset, n);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Ctor(n);
  for (let i = 0; i < n; i++) {
    out[i] = read(view, i * width);
  }
  return out;
}

export const f64 = (c: Column | null | undefined): Float64Array => toF64(decodeColumn(c));
export const i32 = (c: Column | null | undefined): Int32Array => toI32(decodeColumn(c));

function toF64(a: Typed): Float64Array {
  return a instanceof Float64Array ? a : Float64Array.from(a);
}
function toI32(a: Typed): Int32Array {
  return a instanceof Int32Array ? a : Int32Array.from(a);
}
