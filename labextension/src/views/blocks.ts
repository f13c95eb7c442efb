// The block layout after one event: one row per live segment, one rect.gm-block per allocated
// block (rounding waste lighter at its end), cached free in grey; a tooltip on hover. SVG.
import { formatBytes, formatCount, frameText, hex } from '../format';
import { expandableSummary, layoutGeometry, type LayoutGeom, MIN_ROW_PX, rowLabel, unmappedTip } from '../layout';
import type { Lives, View } from '../payload';
import { layoutAt, type LayoutAt } from '../replay';
import { layoutKeys } from '../ticks';
import * as C from './colors';
import { clear, h, n2, s } from './dom';

/** The most blocks drawn; the rest are counted, not drawn. */
export const MAX_DRAWN_BLOCKS = 50000;

let hatches = 0;

/** Narrowest an unmapped stretch is drawn, so that a one-page hole still shows. */
const MIN_UNMAPPED_PX = 1;

export class BlocksView {
  readonly node: HTMLDivElement;
  readonly svg: SVGSVGElement;
  readonly head: HTMLDivElement;
  private readonly wrap: HTMLDivElement;
  private view: View | null = null;
  /** The lives the layout is drawn from: the saved ones, or a kernel's answer. */
  private lives: Lives | null = null;
  private at: LayoutAt | null = null;
  private geom: LayoutGeom | null = null;
  private width = 760;
  /** The id of this view's hatch pattern (unmapped ranges). */
  private readonly hatch = `gm-hatch-${++hatches}`;

  constructor(private readonly tip: HTMLDivElement, private readonly root: HTMLElement) {
    this.head = h('div', { class: 'gm-layout-head' });
    this.svg = s('svg', { class: 'gm-layout' });
    this.wrap = h('div', { class: 'gm-layout-wrap' });
    this.wrap.append(this.svg);
    this.node = h('div', { class: 'gm-blocks' });
    this.node.append(this.head, this.wrap);
    this.svg.addEventListener('mousemove', this.onMove);
    this.svg.addEventListener('mouseleave', () => this.hideTip());
  }

  setView(view: View | null): void {
    this.view = view;
  }

  resize(width: number): void {
    width -= 18; // room for the scroll bar of a tall layout
    if (width > 0 && Math.abs(width - this.width) >= 1) {
      this.width = width;
      this.draw();
    }
  }

  /** Show the layout after event k, from `lives` (default: the saved ones); returns it. */
  show(k: number, lives: Lives | null = this.view?.lives ?? null): LayoutAt | null {
    this.lives = lives;
    this.at = this.view && lives ? layoutAt(lives, k) : null;
    this.draw();
    return this.at;
  }

  get layout(): LayoutAt | null {
    return this.at;
  }

  private draw(): void {
    clear(this.svg);
    clear(this.head);
    const v = this.view;
    const at = this.at;
    const L = this.lives;
    if (!v || !at || !L) {
      this.svg.setAttribute('height', '0');
      return;
    }
    const w = Math.max(320, this.width);
    const geom = layoutGeometry(L, at, { width: w, labelWidth: 236 });
    this.geom = geom;
    this.svg.setAttribute('width', String(w));
    this.svg.setAttribute('height', String(geom.height));
    this.svg.setAttribute('viewBox', `0 0 ${w} ${geom.height}`);
    const B = L.blocks;
    let drawn = 0;
    let rounding = 0;
    const frag = document.createDocumentFragment();
    let expandable = 0;
    let unmappedDrawn = false;
    if (geom.rows.some(r => r.row.expandable)) {
      const defs = s('defs');
      const pat = s('pattern', { id: this.hatch, patternUnits: 'userSpaceOnUse', width: 6, height: 6, patternTransform: 'rotate(45)' });
      pat.append(s('rect', { width: 6, height: 6, fill: C.UNMAPPED_BG }), s('line', { x1: 0, y1: 0, x2: 0, y2: 6, stroke: C.UNMAPPED, 'stroke-width': 2 }));
      defs.append(pat);
      frag.append(defs);
    }
    for (const [r, row] of geom.rows.entries()) {
      const seg = row.seg;
      if (geom.labelled) {
        const label = s(
          'text',
          { class: 'gm-seglabel', x: geom.barX - 9, y: row.y + row.h - 3, 'text-anchor': 'end' },
          rowLabel(row.row, formatBytes, hex)
        );
        if (row.row.expandable) {
          label.append(s('title', {}, expandableSummary(row.row, formatBytes)));
        }
        frag.append(label);
      }
      frag.append(
        s('rect', {
          class: 'gm-pool',
          x: geom.barX - 5,
          y: row.y,
          width: 3,
          height: row.h,
          fill: seg.small ? C.SMALL_POOL : C.LARGE_POOL
        })
      );
      if (!row.row.expandable) {
        frag.append(
          s('rect', { class: 'gm-segment', 'data-i': seg.i, x: row.x, y: row.y, width: n2(row.w), height: row.h })
        );
      } else {
        expandable += 1;
        for (const p of row.parts) {
          frag.append(
            s('rect', { class: 'gm-segment', 'data-i': p.seg.i, 'data-row': r, x: n2(p.x), y: row.y, width: n2(p.w), height: row.h })
          );
        }
        for (const [j, u] of row.unmapped.entries()) {
          unmappedDrawn = true;
          frag.append(
            s('rect', { class: 'gm-unmapped', 'data-row': r, 'data-j': j, x: n2(u.x), y: row.y, width: n2(Math.max(u.w, MIN_UNMAPPED_PX)), height: row.h, fill: `url(#${this.hatch})` })
          );
        }
        if (row.tail) {
          unmappedDrawn = true;
          const t = row.tail;
          frag.append(
            s('rect', { class: 'gm-unmapped gm-tail', 'data-row': r, x: n2(t.x), y: row.y, width: n2(t.w), height: row.h, fill: `url(#${this.hatch})` })
          );
          if (row.h >= 10) {
            frag.append(
              s('text', { class: 'gm-seglabel gm-tail-label', x: n2(t.x + t.w - 3), y: row.y + row.h - 3, 'text-anchor': 'end' }, `… ${formatBytes(row.row.range)} range`)
            );
          }
        }
      }
      for (const b of row.blocks) {
        rounding += Math.max(B.size[b.i] - B.requested[b.i], 0);
        if (drawn >= MAX_DRAWN_BLOCKS) {
          continue;
        }
        drawn += 1;
        frag.append(
          s('rect', {
            class: 'gm-block',
            'data-i': b.i,
            x: n2(b.x),
            y: row.y,
            width: n2(b.w),
            height: row.h,
            fill: C.BLOCK
          })
        );
        const waste = b.w - b.reqW;
        if (waste >= 0.5) {
          frag.append(
            s('rect', {
              class: 'gm-waste',
              x: n2(b.x + b.reqW),
              y: row.y + (row.h > 6 ? 2 : 0),
              width: n2(waste),
              height: row.h > 6 ? row.h - 4 : row.h,
              fill: C.ROUNDING
            })
          );
        }
      }
    }
    this.svg.append(frag);
    this.svg.dataset.blocks = String(at.nBlocks);
    this.svg.dataset.drawn = String(drawn);
    this.svg.dataset.segments = String(at.segments.length);
    this.svg.dataset.rows = String(geom.rows.length);
    this.svg.dataset.expandable = String(expandable);
    const cached = at.reserved - at.allocated;
    const total = h('b', {}, 'Block layout');
    const classic = at.segments.filter(g => !L.segments.expandable[g.i]).length;
    this.head.append(
      total,
      ` · ${formatCount(classic)} segments` +
        (expandable > 0 ? ` · ${formatCount(expandable)} expandable` : '') +
        ` · ${formatCount(at.nBlocks)} blocks` +
        (drawn < at.nBlocks ? ` (${formatCount(drawn)} drawn)` : '')
    );
    const colors = { allocated: C.BLOCK, rounding: C.ROUNDING, cached: C.CACHED };
    const names = { allocated: 'allocated', rounding: 'lost to rounding', cached: 'cached free' };
    const bytes = { allocated: at.allocated - rounding, rounding, cached };
    for (const key of layoutKeys(bytes)) {
      const sw = h('i', { class: 'gm-swatch' });
      sw.style.background = colors[key];
      this.head.append(' ', h('span', { class: 'gm-key' }, sw, `${names[key]} ${formatBytes(bytes[key])}`));
    }
    // the mark at each row's start: which pool the segment belongs to
    for (const [color, name, small] of [
      [C.LARGE_POOL, 'large pool', false],
      [C.SMALL_POOL, 'small pool (≤ 1 MiB blocks)', true]
    ] as const) {
      if (at.segments.some(g => Boolean(L.segments.small[g.i]) === small)) {
        const sw = h('i', { class: 'gm-swatch gm-swatch-pool' });
        sw.style.background = color;
        this.head.append(' ', h('span', { class: 'gm-key gm-pool-key' }, sw, name));
      }
    }
    if (geom.rows.length > 1) {
      this.head.append(' ', h('span', { class: 'gm-muted gm-scale-note' }, `· rows to scale (none narrower than ${MIN_ROW_PX} px)`));
    }
    if (unmappedDrawn) {
      const sw = h('i', { class: 'gm-swatch gm-swatch-unmapped' });
      this.head.append(' ', h('span', { class: 'gm-key' }, sw, 'unmapped (reserved range, no memory)'));
    }
    if (L.dropped > 0) {
      const what = L.exact ? 'smallest blocks not sent' : 'short-lived blocks left out';
      this.head.append(' ', h('span', { class: 'gm-muted' }, `(${formatCount(L.dropped)} ${what})`));
    }
  }

  private hideTip(): void {
    this.tip.hidden = true;
  }

  /**
   * Below and right of the pointer, kept inside the view (the output area clips what leaves
   * it): left of the pointer near the right edge, above it near the bottom.
   */
  private placeTip(ev: MouseEvent): void {
    const r = this.root.getBoundingClientRect();
    this.tip.hidden = false;
    const w = this.tip.offsetWidth;
    const ht = this.tip.offsetHeight;
    const x = ev.clientX - r.left;
    const y = ev.clientY - r.top;
    const left = Math.min(x + 12, r.width - w);
    const top = y + 14 + ht <= r.height ? y + 14 : y - 10 - ht;
    this.tip.style.left = `${Math.max(0, left)}px`;
    this.tip.style.top = `${Math.max(0, top)}px`;
  }

  private onMove = (ev: MouseEvent): void => {
    const v = this.view;
    const L = this.lives;
    const target = ev.target as Element | null;
    if (!v || !L || !target || !this.geom) {
      this.hideTip();
      return;
    }
    const cls = target.getAttribute('class');
    const i = Number(target.getAttribute('data-i'));
    delete this.tip.dataset.unmapped;
    if (cls === 'gm-block') {
      fillBlockTip(this.tip, v, L, i);
      this.tip.dataset.i = String(i);
      this.placeTip(ev);
    } else if (cls === 'gm-segment') {
      const S = L.segments;
      clear(this.tip);
      delete this.tip.dataset.i;
      const where = S.expandable[i] ? 'mapped range of an expandable' : 'segment';
      this.tip.append(
        h('div', {}, h('b', {}, 'cached free'), ` in a ${formatBytes(S.size[i])} ${S.small[i] ? 'small' : 'large'}-pool ${where}` + (S.expandable[i] ? ' segment' : '')),
        h('div', { class: 'gm-muted' }, `${S.expandable[i] ? 'range' : 'segment'} ${hex(S.addr[i])}, stream ${S.stream[i]}`)
      );
      this.placeTip(ev);
    } else if (cls !== null && cls.startsWith('gm-unmapped')) {
      const row = this.geom.rows[Number(target.getAttribute('data-row'))];
      if (!row) {
        this.hideTip();
        return;
      }
      const tail = cls.includes('gm-tail');
      const gap = tail ? { addr: row.row.addr + row.row.size, size: row.tail?.bytes ?? 0 } : row.unmapped[Number(target.getAttribute('data-j'))];
      const [head, more] = unmappedTip(row.row, gap, tail, formatBytes, hex);
      clear(this.tip);
      delete this.tip.dataset.i;
      this.tip.dataset.unmapped = '1';
      this.tip.append(h('div', {}, h('b', {}, head)), h('div', { class: 'gm-muted' }, more));
      this.placeTip(ev);
    } else {
      this.hideTip();
    }
  };
}

/** The tooltip of block life i of `lives`: size, requested, address, site, cell, stack. */
export function fillBlockTip(tip: HTMLElement, v: View, lives: Lives, i: number): void {
  const B = lives.blocks;
  clear(tip);
  const size = B.size[i];
  const req = Math.min(B.requested[i], size);
  tip.append(
    h('div', {}, h('b', {}, formatBytes(size)), ` block at ${hex(B.addr[i])} · allocated`),
    h(
      'div',
      { class: 'gm-muted' },
      `requested ${formatBytes(req)}` + (size > req ? ` · ${formatBytes(size - req)} lost to rounding` : '')
    )
  );
  const site = B.site[i];
  const cell = B.cell[i];
  const where: string[] = [];
  if (site >= 0 && site < lives.sites.length) {
    where.push(`allocated at ${String(lives.sites[site])}`);
  }
  if (cell >= 0) {
    where.push(`cell [${cell}]`);
  }
  if (B.start[i] < 0) {
    if (v.nEvents > 0) {
      where.push('before the trace'); // a snapshot with no trace has no before
    }
  } else {
    where.push(`event ${B.start[i]}` + (B.end[i] < v.nEvents ? `, freed at event ${B.end[i]}` : ', live at the end'));
  }
  if (where.length > 0) {
    tip.append(h('div', { class: 'gm-muted' }, where.join(' · ')));
  }
  const held = holdersOf(v, B.addr[i]);
  if (held.length > 0 && B.end[i] >= v.nEvents) {
    tip.append(h('div', { class: 'gm-held' }, `held by ${held.join(', ')}`));
  }
  tip.append(stackNode(lives.stacks, B.stack[i]));
}

/** The variables that hold the block at `addr` at the end of the view (none known: []). */
export function holdersOf(v: View, addr: number): string[] {
  for (const [a, names] of v.raw.block_holders ?? []) {
    if (a === addr && Array.isArray(names)) {
      return names.map(String);
    }
  }
  for (const b of v.raw.surviving ?? []) {
    if (b.address === addr && Array.isArray(b.holders)) {
      return b.holders.map(String);
    }
  }
  return [];
}

/** A stack id of a block whose frames a saved view's budget left out (the file has them). */
export const STACK_LEFT_OUT = -2;

/** The frames of stack id `id` of `stacks` as `filename:line in name`, innermost first. */
export function stackNode(stacks: ReadonlyArray<unknown>, id: number): HTMLElement {
  const stack = id >= 0 ? stacks[id] : undefined;
  if (id === STACK_LEFT_OUT) {
    return h('div', { class: 'gm-stack gm-muted' }, 'stack not kept in the saved view (too many to keep)');
  }
  if (!Array.isArray(stack) || stack.length === 0) {
    return h('div', { class: 'gm-stack gm-muted' }, 'no stack recorded');
  }
  return h('div', { class: 'gm-stack' }, ...stack.map(f => h('div', { class: 'gm-frame' }, frameText(f))));
}
