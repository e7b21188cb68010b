/**
 * A main-area tab around a view that reads a cluster from the server: a refresh button in its
 * toolbar, opened, activated, and read once.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { MainAreaWidget, ToolbarButton } from '@jupyterlab/apputils';
import { refreshIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

/** A view whose content is read again by `refresh()`. */
export interface IRefreshable extends Widget {
  refresh(): Promise<void>;
}

/** The tab of `view` (id `slurm-ray-<kind>-<cluster>-<time>`), not yet added to the shell. */
export function refreshableTab<T extends IRefreshable>(
  view: T,
  kind: string,
  clusterId: string,
  label: string,
  refreshTooltip: string
): MainAreaWidget<T> {
  const tab = new MainAreaWidget({ content: view });
  tab.id = `slurm-ray-${kind}-${clusterId}-${Date.now()}`;
  tab.title.label = label;
  tab.title.closable = true;
  tab.toolbar.addItem(
    'refresh',
    new ToolbarButton({
      icon: refreshIcon,
      tooltip: refreshTooltip,
      onClick: () => void view.refresh()
    })
  );
  return tab;
}

/** Show `tab` in the main area and read its view. */
export async function openTab<T extends IRefreshable>(
  app: JupyterFrontEnd,
  tab: MainAreaWidget<T>
): Promise<void> {
  app.shell.add(tab, 'main');
  app.shell.activateById(tab.id);
  await tab.content.refresh();
}
