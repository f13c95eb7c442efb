// The badge under each executed cell: `+1.2 GiB · peak 3.4 GiB`, red after an OOM, dimmed when
// it is of an older run than the cell's, a tooltip naming the holders. Drawn from the cell's
// badge (the kernel's of this session, else its metadata), so a saved notebook shows it with no
// kernel. A click opens the panel at the cell's row.
import type { Cell } from '@jupyterlab/cells';
import type { ICodeCellModel } from '@jupyterlab/cells';
import type { NotebookPanel } from '@jupyterlab/notebook';
import { PanelLayout, Widget } from '@lumino/widgets';
import { badgeText, badgeTip, hadOom, isStale } from './badgeText';
import { chipIcon } from './icon';
import type { NotebookSession } from './session';

/** One cell's badge. */
export class BadgeWidget extends Widget {
  private readonly text: HTMLSpanElement;

  constructor(
    readonly cell: Cell,
    private readonly onOpen: (cellId: string) => void
  ) {
    super();
    this.addClass('jp-GpumemBadge');
    const icon = document.createElement('span');
    icon.className = 'jp-GpumemBadge-icon';
    chipIcon.element({ container: icon, height: '12px', width: '12px' });
    this.text = document.createElement('span');
    this.text.className = 'jp-GpumemBadge-text';
    this.node.append(icon, this.text);
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.addEventListener('click', () => this.onOpen(this.cell.model.id));
    this.node.addEventListener('keydown', ev => {
      if (ev.key === 'Enter' || ev.key === ' ') {
        ev.preventDefault();
        this.onOpen(this.cell.model.id);
      }
    });
    this.hide();
  }

  /** Show what `session` has for the cell; hidden with none, or with badges off. */
  render(session: NotebookSession, shown: boolean): void {
    const badge = shown ? session.badgeOf(this.cell.model) : null;
    if (!badge) {
      this.hide();
      return;
    }
    const count = (this.cell.model as ICodeCellModel).executionCount;
    this.text.textContent = badgeText(badge);
    this.node.title = `${badgeTip(badge, count)}\n\nClick to see the cell in the GPU memory panel.`;
    this.node.classList.toggle('jp-mod-oom', hadOom(badge));
    this.node.classList.toggle('jp-mod-stale', isStale(badge, count));
    this.node.dataset.executionCount = String(badge.execution_count);
    this.show();
  }
}

/** The badges of one notebook: one a code cell, placed under its input once it is drawn. */
export class NotebookBadges {
  private readonly badges = new Map<Cell, BadgeWidget>();
  private disposed = false;

  constructor(
    private readonly panel: NotebookPanel,
    private readonly session: NotebookSession,
    private readonly shown: () => boolean,
    private readonly onOpen: (panel: NotebookPanel, cellId: string) => void
  ) {
    session.changed.connect(this.refresh, this);
    void panel.context.ready.then(() => {
      panel.model?.cells.changed.connect(this.refresh, this);
      this.refresh();
    });
    panel.disposed.connect(() => this.dispose());
  }

  dispose(): void {
    if (this.disposed) {
      return;
    }
    this.disposed = true;
    this.session.changed.disconnect(this.refresh, this);
    for (const badge of this.badges.values()) {
      badge.dispose();
    }
    this.badges.clear();
  }

  /** Badges for new cells, none for gone ones, and every badge's text up to date. */
  refresh(): void {
    if (this.disposed) {
      return;
    }
    const cells = new Set(this.panel.content.widgets.filter(c => c.model.type === 'code'));
    for (const [cell, badge] of this.badges) {
      if (!cells.has(cell) || cell.isDisposed) {
        badge.dispose();
        this.badges.delete(cell);
      }
    }
    for (const cell of cells) {
      const badge = this.badges.get(cell);
      if (badge) {
        badge.render(this.session, this.shown());
      } else {
        this.add(cell);
      }
    }
  }

  private add(cell: Cell): void {
    const badge = new BadgeWidget(cell, id => this.onOpen(this.panel, id));
    this.badges.set(cell, badge);
    const stateChanged = (): void => badge.render(this.session, this.shown());
    cell.model.metadataChanged.connect(stateChanged);
    cell.model.stateChanged.connect(stateChanged);
    badge.disposed.connect(() => {
      if (!cell.model.isDisposed) {
        cell.model.metadataChanged.disconnect(stateChanged);
        cell.model.stateChanged.disconnect(stateChanged);
      }
    });
    void cell.ready.then(() => {
      if (badge.isDisposed || cell.isDisposed) {
        return;
      }
      // under the input, like the execute-time badge: after the input wrapper
      const layout = cell.layout as PanelLayout;
      const at = layout.widgets.findIndex(w => w.hasClass('jp-Cell-inputWrapper'));
      layout.insertWidget(at >= 0 ? at + 1 : layout.widgets.length, badge);
      badge.render(this.session, this.shown());
    });
  }
}
