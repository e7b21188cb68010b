/**
 * jupyter-slurm-ray: the "Slurm Ray" sidebar, Ray dashboards in tabs, commands and settings.
 *
 * Dashboard links rendered by the kernel side (the widget's "Open dashboard") are
 * `<base_url>slurm-ray/dashboard/<id>/` anchors, optionally marked `data-slurm-ray-dashboard`;
 * inside JupyterLab a click on one opens the dashboard tab instead of a browser tab.
 *
 * After a page reload the dashboard, logs and details tabs come back (JupyterLab's layout
 * restorer, one tracker per kind: tabs.ts, restore.ts) and the sidebar remembers which
 * clusters it already warned about their walltime (the state DB).
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, IFrame } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStateDB } from '@jupyterlab/statedb';
import { kernelIcon } from '@jupyterlab/ui-components';

import { addCommands, CommandIDs, paletteCommands } from './commands';
import { DetailsView } from './details';
import { dashboardLinkTarget } from './links';
import { LogView } from './logs';
import { SIDEBAR_STATE_KEY, sidebarState, warnedIn } from './restore';
import { ClusterSidebar } from './sidebar';
import { ClusterTabs } from './tabs';

/** A set of cluster ids saved to the state DB at every addition. */
class RememberedSet extends Set<string> {
  constructor(private readonly _save: (ids: Set<string>) => void) {
    super();
  }

  add(id: string): this {
    super.add(id);
    this._save(this);
    return this;
  }

  /** Add the ids read back from the state DB (nothing to save). */
  load(ids: string[]): void {
    ids.forEach(id => super.add(id));
  }
}

/** The sidebar's warned clusters, read from and saved to `state` (kept across reloads). */
function rememberedWarnings(state: IStateDB | null): { warned: Set<string>; ready: Promise<void> } {
  if (!state) {
    return { warned: new Set<string>(), ready: Promise.resolve() };
  }
  const warned = new RememberedSet(ids => {
    state.save(SIDEBAR_STATE_KEY, sidebarState(ids)).catch(reason => {
      console.warn('jupyter-slurm-ray: the sidebar state was not saved', reason);
    });
  });
  const ready = state
    .fetch(SIDEBAR_STATE_KEY)
    .then(saved => warned.load(warnedIn(saved)))
    .catch(reason => console.warn('jupyter-slurm-ray: the sidebar state was not read', reason));
  return { warned, ready };
}

const PLUGIN_ID = 'jupyter-slurm-ray:plugin';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Slurm Ray clusters: sidebar, dashboards in tabs, commands.',
  autoStart: true,
  optional: [ICommandPalette, ISettingRegistry, ILayoutRestorer, IStateDB],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null,
    state: IStateDB | null
  ) => {
    const sidebar = new ClusterSidebar(app.commands, rememberedWarnings(state));
    sidebar.title.icon = kernelIcon;
    sidebar.title.label = 'Slurm Ray';
    let defaultProfile = '';
    const tabs = {
      dashboard: new ClusterTabs<IFrame>('dashboard'),
      logs: new ClusterTabs<LogView>('logs'),
      details: new ClusterTabs<DetailsView>('details')
    };

    addCommands(app, {
      refresh: () => sidebar.refresh(),
      remove: id => sidebar.remove(id),
      nameOf: id => sidebar.clusters.find(c => c.id === id)?.name,
      clusterOf: id => sidebar.clusters.find(c => c.id === id),
      defaultProfile: () => defaultProfile,
      sidebarId: sidebar.id,
      tabs
    });
    for (const command of paletteCommands) {
      palette?.addItem({ command, category: 'Slurm Ray' });
    }

    app.shell.add(sidebar, 'left', { rank: 850 });
    if (restorer) {
      restorer.add(sidebar, sidebar.id);
      // After a reload each tab's command runs again with its cluster (a fresh dashboard URL).
      tabs.dashboard.restoreWith(restorer, CommandIDs.openDashboard);
      tabs.logs.restoreWith(restorer, CommandIDs.showLogs);
      tabs.details.restoreWith(restorer, CommandIDs.showDetails);
    }

    if (settingRegistry) {
      const apply = (settings: ISettingRegistry.ISettings) => {
        sidebar.refreshInterval = settings.get('refreshInterval').composite as number;
        defaultProfile = settings.get('defaultProfile').composite as string;
      };
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          apply(settings);
          settings.changed.connect(apply);
        })
        .catch(reason => console.warn('jupyter-slurm-ray: settings not loaded', reason));
    }

    // Dashboard links anywhere in the page (notebook outputs, widgets) open as Lab tabs.
    const baseUrl = PageConfig.getBaseUrl();
    document.addEventListener(
      'click',
      event => {
        if (
          event.defaultPrevented ||
          event.button !== 0 ||
          event.ctrlKey ||
          event.metaKey ||
          event.shiftKey
        ) {
          return;
        }
        const anchor = (event.target as Element | null)?.closest?.(
          'a[href]'
        ) as HTMLAnchorElement | null;
        const id = anchor ? dashboardLinkTarget(anchor, baseUrl) : null;
        if (id) {
          event.preventDefault();
          event.stopPropagation();
          void app.commands.execute(CommandIDs.openDashboard, { id });
        }
      },
      true
    );
  }
};

export default plugin;
