// The plugin of the GPU memory panel and the cell badges (JupyterLab 4 and Notebook 7): a
// session a notebook (its channel to the kernel, its saved record), the badges of its cells, one
// panel in the right area following the active notebook, a command (palette, toolbar button),
// and two settings.
import { ILayoutRestorer, type JupyterFrontEnd, type JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, type NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { NotebookBadges } from './badges';
import { chipIcon } from './icon';
import { GpuMemPanel } from './panel';
import { NotebookSession } from './session';

export const PLUGIN_ID = 'jupyter-gpumem:plugin';
/** Shows the panel; `{cellId}` marks that cell's row. */
export const OPEN_PANEL = 'jupyter-gpumem:open-panel';

interface Settings {
  showBadges: boolean;
  saveInNotebook: boolean;
}

export const lab: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'A GPU memory side panel for the active notebook, and a badge under each executed cell.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ISettingRegistry, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    palette: ICommandPalette | null,
    registry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null
  ) => {
    const settings: Settings = { showBadges: true, saveInNotebook: true };
    const sessions = new Map<NotebookPanel, { session: NotebookSession; badges: NotebookBadges }>();
    const panel = new GpuMemPanel();
    app.shell.add(panel, 'right', { rank: 850 });
    restorer?.add(panel, panel.id);

    const open = (nb: NotebookPanel, cellId?: string): void => {
      void app.commands.execute(OPEN_PANEL, cellId ? { cellId } : {});
      if (tracker.currentWidget !== nb) {
        panel.setSession(sessions.get(nb)?.session ?? null);
      }
    };
    const setUp = (nb: NotebookPanel): void => {
      if (sessions.has(nb)) {
        return;
      }
      const session = new NotebookSession(nb, { save: () => settings.saveInNotebook });
      const badges = new NotebookBadges(nb, session, () => settings.showBadges, open);
      sessions.set(nb, { session, badges });
      nb.disposed.connect(() => sessions.delete(nb));
    };
    const follow = (): void => {
      const nb = tracker.currentWidget;
      panel.setSession(nb ? (sessions.get(nb)?.session ?? null) : null);
    };
    tracker.forEach(setUp);
    tracker.widgetAdded.connect((_, nb) => {
      setUp(nb);
      follow();
    });
    tracker.currentChanged.connect(follow);
    follow();

    app.commands.addCommand(OPEN_PANEL, {
      label: args => (args.toolbar ? '' : 'Show GPU Memory Panel'),
      caption: 'The GPU memory of this notebook’s session: the timeline, each cell, the devices',
      icon: chipIcon,
      execute: args => {
        app.shell.activateById(panel.id);
        if (typeof args.cellId === 'string') {
          panel.showCell(args.cellId);
        }
      }
    });
    palette?.addItem({ command: OPEN_PANEL, category: 'GPU Memory' });

    if (registry) {
      void registry
        .load(PLUGIN_ID)
        .then(loaded => {
          const read = (): void => {
            settings.showBadges = loaded.get('showBadges').composite !== false;
            settings.saveInNotebook = loaded.get('saveInNotebook').composite !== false;
            for (const { badges } of sessions.values()) {
              badges.refresh();
            }
          };
          read();
          loaded.changed.connect(read);
        })
        .catch(reason => console.warn('jupyter-gpumem: cannot read the settings', reason));
    }
  }
};
