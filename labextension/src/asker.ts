// What a trace view draws at each zoom and slider position, and when it asks its kernel for
// more: the finest series known for the window, the layout from lives exact at the event. A
// question waits until the zoom or the slider rests; an answer to an older question is kept
// but not drawn. No DOM (the view draws through `AskerDraw`).
import { ASK_COLUMNS, coarseNote, type DetailSource, layoutNote, LivesCache, SeriesCache, tooCoarse, windowToAsk } from './detail';
import { formatCount } from './format';
import type { DecodedTimeline, Lives, View } from './payload';
import { endIndex, snapEvent, stops } from './replay';

/** How long a zoom or a slider rests before the kernel is asked (ms). */
export const ASK_AFTER_MS = { window: 120, layout: 60 };

/** What the asker has the view draw. */
export interface AskerDraw {
  /** Draw the timeline from `series`. */
  series(series: DecodedTimeline): void;
  /** Say this under the timeline ('' hides it); `state`: '' | 'coarse' | 'loading'. */
  note(text: string, state: string): void;
  /** Draw the layout after event k from `lives`; `note` says why it is not the one asked. */
  layout(k: number, lives: Lives, note: string): void;
  /** The layout after event k is asked of the kernel. */
  asking(k: number): void;
  /** The window the timeline shows now, and its width in pixels. */
  shown(): [lo: number, hi: number, px: number];
}

function why(e: unknown): string {
  return `the kernel did not answer (${e instanceof Error ? e.message : String(e)})`;
}

export class DetailAsker {
  private readonly series: SeriesCache;
  private readonly lives: LivesCache;
  private readonly stopList: number[] | null;
  private readonly asked = { window: 0, layout: 0 };
  private readonly timers: { window?: ReturnType<typeof setTimeout>; layout?: ReturnType<typeof setTimeout> } = {};

  constructor(
    private readonly view: View,
    private readonly draw: AskerDraw,
    private source: DetailSource | null = null
  ) {
    this.series = new SeriesCache(view.timeline);
    this.lives = new LivesCache(view.lives);
    this.stopList = stops(view.lives, view.nEvents);
  }

  /** Where detail comes from (a kernel), or null: the saved view alone. */
  setSource(source: DetailSource | null): void {
    this.source = source;
    this.zoomed(...this.draw.shown());
  }

  get hasSource(): boolean {
    return this.source !== null;
  }

  dispose(): void {
    clearTimeout(this.timers.window);
    clearTimeout(this.timers.layout);
    this.source = null;
  }

  /**
   * The timeline now shows [lo, hi] in px pixels: draw the finest series known for it; where
   * that is coarser than the pixels, ask the kernel for the window, or say it is coarse.
   */
  zoomed(lo: number, hi: number, px: number): void {
    const v = this.view;
    const best = this.series.best(lo, hi);
    this.draw.series(best);
    clearTimeout(this.timers.window);
    const id = ++this.asked.window;
    if (!tooCoarse(best, lo, hi, px)) {
      this.draw.note('', '');
      return;
    }
    const source = this.source;
    if (!source) {
      this.draw.note(coarseNote(best.perColumn, v.raw.full_trace), 'coarse');
      return;
    }
    this.draw.note(`${formatCount(best.perColumn)} events a column here · asking the kernel for every event…`, 'loading');
    this.timers.window = setTimeout(() => {
      const [i0, i1] = windowToAsk(lo, hi, v.nEvents);
      source.window(i0, i1, ASK_COLUMNS).then(
        answer => {
          this.series.add(answer.timeline);
          if (answer.lives) {
            this.lives.add(answer.lives);
          }
          if (id === this.asked.window) {
            this.zoomed(...this.draw.shown());
          }
        },
        (e: unknown) => {
          if (id === this.asked.window) {
            this.draw.note(`${why(e)}; ${coarseNote(best.perColumn, v.raw.full_trace)}`, 'coarse');
          }
        }
      );
    }, ASK_AFTER_MS.window);
  }

  /**
   * Show the layout after event k: exactly, from lives known to be every life there (the saved
   * ones, or a kernel's answers); else, with a kernel, once it answers; else at the nearest
   * saved checkpoint, saying so.
   */
  layoutAt(k: number): void {
    const v = this.view;
    const want = Math.max(-1, Math.min(endIndex(v.nEvents), Math.round(k)));
    clearTimeout(this.timers.layout);
    const id = ++this.asked.layout;
    const known = this.lives.exactAt(want);
    if (known) {
      this.draw.layout(want, known, '');
      return;
    }
    const nearest = (note: string) => {
      const shown = snapEvent(want, v.nEvents, this.stopList);
      this.draw.layout(shown, v.lives, [note, layoutNote(v, want, shown)].filter(Boolean).join('; '));
    };
    const source = this.source;
    if (!source) {
      nearest('');
      return;
    }
    this.draw.asking(want);
    this.timers.layout = setTimeout(() => {
      source.layout(want).then(
        lives => {
          this.lives.add(lives);
          if (id === this.asked.layout) {
            this.draw.layout(want, lives, '');
          }
        },
        (e: unknown) => {
          if (id === this.asked.layout) {
            nearest(why(e));
          }
        }
      );
    }, ASK_AFTER_MS.layout);
  }
}
