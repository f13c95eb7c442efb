import { describe, expect, it } from 'vitest';
import { byteTickLabel, fixed, formatBytes, formatCount, formatSignedBytes, frameText, hex } from '../src/format';

describe('formatBytes, as the Python format_bytes', () => {
  // pairs checked against jupyter_gpumem.data.units.format_bytes
  const cases: Array<[number, string]> = [
    [0, '0 B'],
    [1, '1 B'],
    [1023, '1023 B'],
    [1023.9, '1023 B'],
    [1024, '1.0 KiB'],
    [1280, '1.2 KiB'], // an exact tie rounds to even, as Python does (toFixed would say 1.3)
    [1536, '1.5 KiB'],
    [102348.8, '100.0 KiB'],
    [102912, '100 KiB'], // 100.5: tie to even
    [102400, '100 KiB'],
    [1048575, '1024 KiB'],
    [429916160, '410 MiB'],
    [1342177280, '1.2 GiB'],
    [3298534883328, '3.0 TiB'],
    [5497558138880000, '5000 TiB'],
    [-512, '-512 B'],
    [-1536, '-1.5 KiB'],
    [2359296, '2.2 MiB'],
    [2464153.6, '2.4 MiB']
  ];
  it.each(cases)('%s bytes is %s', (n, text) => {
    expect(formatBytes(n)).toBe(text);
  });
  it('says a dash for a missing number', () => {
    expect(formatBytes(NaN)).toBe('–');
  });
  it('signs changes', () => {
    expect(formatSignedBytes(1536)).toBe('+1.5 KiB');
    expect(formatSignedBytes(-512)).toBe('-512 B');
    expect(formatSignedBytes(0)).toBe('0 B');
  });
});

describe('fixed', () => {
  it('breaks exact ties to even and rounds the rest to nearest', () => {
    expect(fixed(0.125 * 8 + 0.25, 1)).toBe('1.2');
    expect(fixed(1.75, 1)).toBe('1.8');
    expect(fixed(2.5, 0)).toBe('2');
    expect(fixed(3.5, 0)).toBe('4');
    expect(fixed(2.35, 1)).toBe('2.4'); // 2.35 is a little above 2.35 in binary
  });
});

describe('other text', () => {
  it('writes addresses in hex', () => {
    expect(hex(0x7f0000001000)).toBe('0x7f0000001000');
    expect(hex(0)).toBe('0x0');
    expect(hex(NaN)).toBe('?');
  });
  it('writes counts with separators', () => {
    expect(formatCount(0)).toBe('0');
    expect(formatCount(999)).toBe('999');
    expect(formatCount(1234567)).toBe('1,234,567');
    expect(formatCount(-1000)).toBe('-1,000');
  });
  it('writes frames as filename:line in name', () => {
    expect(frameText(['a.py', 12, 'f'])).toBe('a.py:12 in f');
    expect(frameText(['cell [3]', 4, 'run'])).toBe('cell [3] line 4 in run');
    expect(frameText(['cell [3].py', 4, 'run'])).toBe('cell [3].py:4 in run');
  });
  it('labels byte ticks exactly in the largest unit not above them', () => {
    expect(byteTickLabel(0)).toBe('0');
    expect(byteTickLabel(512)).toBe('512 B');
    expect(byteTickLabel(384 * 1024 * 1024)).toBe('384 MiB');
    expect(byteTickLabel(1.25 * 2 ** 30)).toBe('1.25 GiB');
  });
});
