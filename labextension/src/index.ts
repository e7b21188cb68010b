/**
 * jupyter-slurm-ray: the "Slurm Ray" sidebar, Ray dashboards in tabs, commands and settings.
 *
 * Dashboard links rendered by the kernel side (the widget's "Open dashboard") are
 * `<base_url>slurm-ray/dashboard/<id>/` anchors, optionally marked `data-slurm-ray-dashboard`;
 * inside JupyterLab a click on one opens the dashboard tab instead of a browser tab.
 */
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { kernelIcon } from '@jupyterlab/ui-components';

import { addCommands, CommandIDs, paletteCommands } from './commands';
import { dashboardLinkTarget } from './links';
import { ClusterSidebar } from './sidebar';

const PLUGIN_ID = 'jupyter-slurm-ray:plugin';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Slurm Ray clusters: sidebar, dashboards in tabs, commands.',
  autoStart: true,
  optional: [ICommandPalette, ISettingRegistry, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null
  ) => {
    const sidebar = new ClusterSidebar(app.commands);
    sidebar.title.icon = kernelIcon;
    sidebar.title.label = 'Slurm Ray';
    let defaultProfile = '';

    addCommands(app, {
      refresh: () => sidebar.refresh(),
      remove: id => sidebar.remove(id),
      nameOf: id => sidebar.clusters.find(c => c.id === id)?.name,
      clusterOf: id => sidebar.clusters.find(c => c.id === id),
      defaultProfile: () => defaultProfile,
      sidebarId: sidebar.id
    });
    for (const command of paletteCommands) {
      palette?.addItem({ command, category: 'Slurm Ray' });
    }

    app.shell.add(sidebar, 'left', { rank: 850 });
    restorer?.add(sidebar, sidebar.id);

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
