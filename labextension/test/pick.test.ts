import { describe, expect, it } from 'vitest';
import { decodeLives, decodePayload } from '../src/payload';
import { bandAt, bandStack, inBand, lifeInBand, nearestPoint, pickBlock } from '../src/pick';
import { col, lives, livesPayload, MiB, TRACE_BLOCKS, TRACE_SEGS, tracePayload } from './helpers';

const L = lives(TRACE_BLOCKS, TRACE_SEGS);
const SITES = [0, 1];

describe('bands', () => {
  it('a site band holds its site, the last band the rest', () => {
    expect(inBand(0, 0, SITES)).toBe(true);
    expect(inBand(1, 0, SITES)).toBe(false);
    expect(inBand(-1, 2, SITES)).toBe(true);
    expect(inBand(7, 2, SITES)).toBe(true);
    expect(inBand(1, 2, SITES)).toBe(false);
  });

  it('stacks the live blocks of a band in the order they were made', () => {
    expect(bandStack(L, 3, 0, SITES)).toEqual([0, 2]); // A (event 1) under C (event 3)
    expect(bandStack(L, 4, 0, SITES)).toEqual([2]); // A freed
    expect(bandStack(L, 5, 1, SITES)).toEqual([1, 3]); // B (2) under D (5), though D's address is lower
    expect(bandStack(L, 5, 2, SITES)).toEqual([4]); // the block older than the trace
  });
});

describe('pickBlock', () => {
  it('names the block under the height', () => {
    expect(pickBlock(L, 3, 0, 0, SITES)).toBe(0);
    expect(pickBlock(L, 3, 0, 4 * MiB - 1, SITES)).toBe(0);
    expect(pickBlock(L, 3, 0, 4 * MiB, SITES)).toBe(2);
    expect(pickBlock(L, 3, 0, 99 * MiB, SITES)).toBe(2); // above the top: the top block
    expect(pickBlock(L, 5, 1, 2.5 * MiB, SITES)).toBe(3);
  });
  it('says -1 when the band has nothing live', () => {
    expect(pickBlock(L, 0, 0, 0, SITES)).toBe(-1);
  });
});

describe('bandAt and nearestPoint', () => {
  const v = decodePayload(tracePayload());
  it('finds the band and the height above its bottom', () => {
    // after event 3: site 0 = 10 MiB, site 1 = 2 MiB, other = 1 MiB
    expect(bandAt(v.timeline, 3, 5 * MiB)).toEqual({ band: 0, offset: 5 * MiB, bottom: 0, top: 10 * MiB });
    expect(bandAt(v.timeline, 3, 11 * MiB)).toEqual({ band: 1, offset: MiB, bottom: 10 * MiB, top: 12 * MiB });
    expect(bandAt(v.timeline, 3, 12.5 * MiB)?.band).toBe(2);
    expect(bandAt(v.timeline, 3, 14 * MiB)).toBeNull(); // above every band: cached, not allocated
  });
  it('the band bytes agree with the lives: picking at the top of each band names its last block', () => {
    for (let j = 0; j < v.timeline.n; j++) {
      const k = v.timeline.index[j];
      v.timeline.bands.forEach((band, g) => {
        const stack = bandStack(v.lives, k, g, v.timeline.bandSites);
        const bytes = stack.reduce((t, i) => t + v.lives.blocks.size[i], 0);
        expect(bytes).toBe(band[j]);
      });
    }
  });
  it('finds the nearest point, the earlier on a tie', () => {
    const idx = [0, 10, 20, 40];
    expect(nearestPoint(idx, -5)).toBe(0);
    expect(nearestPoint(idx, 14)).toBe(1);
    expect(nearestPoint(idx, 15)).toBe(1);
    expect(nearestPoint(idx, 16)).toBe(2);
    expect(nearestPoint(idx, 99)).toBe(3);
    expect(nearestPoint([], 3)).toBe(-1);
  });
});

describe('the band column', () => {
  // The same lives with bands by holder: A and C freed (band 1), B and D held (band 0), the
  // old block held by no variable (band 2); sites no longer say the band.
  const HELD = [1, 0, 1, 0, 2];
  const LB = lives(
    TRACE_BLOCKS.map((b, i) => ({ ...b, band: HELD[i] })),
    TRACE_SEGS
  );
  it('decodes, and an older payload has none', () => {
    expect(Array.from(LB.blocks.band)).toEqual(HELD);
    expect(L.blocks.band.length).toBe(0);
  });
  it('says which band a life is in, whatever the sites', () => {
    expect(lifeInBand(LB, 0, 1, SITES)).toBe(true);
    expect(lifeInBand(LB, 0, 0, SITES)).toBe(false); // site 0, but band 1
    expect(lifeInBand(L, 0, 0, SITES)).toBe(true); // no column: by site
  });
  it('stacks and picks by it', () => {
    expect(bandStack(LB, 3, 1, [])).toEqual([0, 2]);
    expect(bandStack(LB, 5, 0, [])).toEqual([1, 3]);
    expect(bandStack(LB, 5, 2, [])).toEqual([4]);
    expect(pickBlock(LB, 5, 0, 2.5 * MiB, [])).toBe(3);
    expect(pickBlock(LB, 3, 0, 0, [])).toBe(1);
  });
  it('a band column of the wrong length is refused', () => {
    const p = livesPayload(TRACE_BLOCKS.map((b, i) => ({ ...b, band: HELD[i] })), TRACE_SEGS);
    p.blocks = { ...p.blocks, band: col('i4', [0, 1], 'binary') };
    expect(() => decodeLives(p)).toThrow(TypeError);
  });
});
