/**
 * Main-area tabs of a cluster (its dashboard, logs, details): one per cluster and kind, each
 * kind tracked by a `WidgetTracker` so that JupyterLab's layout restorer reopens them after a
 * page reload by running their command again (see restore.ts for what is kept). A refreshable
 * tab wraps a view that reads a cluster from the server, with a refresh button in its toolbar.
 */
import { ILayoutRestorer, JupyterFrontEnd } from '@jupyterlab/application';
import { MainAreaWidget, Notification, ToolbarButton, WidgetTracker } from '@jupyterlab/apputils';
import { refreshIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { goneText, restoreArgs, tabId, TabKind, tabNamespace } from './restore';

/** A view whose content is read again by `refresh()`. */
export interface IRefreshable extends Widget {
  refresh(): Promise<void>;
  /** The last read found no such cluster (404): it was forgotten. */
  readonly gone: boolean;
}

/** The open tabs of one kind, one per cluster, restored after a reload. */
export class ClusterTabs<T extends Widget> {
  constructor(readonly kind: TabKind) {
    this.tracker = new WidgetTracker<MainAreaWidget<T>>({ namespace: tabNamespace(kind) });
  }

  readonly tracker: WidgetTracker<MainAreaWidget<T>>;

  /** The open tab of cluster `id`, if any. */
  find(id: string): MainAreaWidget<T> | null {
    return this.tracker.find(tab => tab.node.dataset.slurmRayCluster === id) ?? null;
  }

  /** Give `tab` its id for cluster `id` and track it (its state: the cluster, not a URL). */
  track(tab: MainAreaWidget<T>, id: string, name?: string): void {
    tab.id = tabId(this.kind, id);
    tab.node.dataset.slurmRayCluster = id;
    if (name) {
      tab.node.dataset.slurmRayName = name;
    }
    void this.tracker.add(tab);
  }

  /** After a reload, reopen these tabs by running `command` with each one's cluster. */
  restoreWith(restorer: ILayoutRestorer, command: string): void {
    void restorer.restore(this.tracker, {
      command,
      args: tab => restoreArgs(clusterOf(tab), tab.node.dataset.slurmRayName),
      name: tab => clusterOf(tab)
    });
  }
}

function clusterOf(tab: Widget): string {
  return tab.node.dataset.slurmRayCluster ?? '';
}

/** The tab of `view` for cluster `clusterId`, tracked in `tabs`, not yet shown. */
export function refreshableTab<T extends IRefreshable>(
  tabs: ClusterTabs<T>,
  view: T,
  clusterId: string,
  name: string | undefined,
  label: string,
  refreshTooltip: string
): MainAreaWidget<T> {
  const tab = new MainAreaWidget({ content: view });
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
  tabs.track(tab, clusterId, name);
  return tab;
}

/** Show `tab` in the main area (unless it is already), bring it forward and read its view. */
export async function openTab<T extends IRefreshable>(
  app: JupyterFrontEnd,
  tab: MainAreaWidget<T>
): Promise<void> {
  if (!tab.isAttached) {
    app.shell.add(tab, 'main');
  }
  app.shell.activateById(tab.id);
  await tab.content.refresh();
}

/**
 * Open (or bring forward and read again) the tab of cluster `id` in `tabs`, made by `create`
 * when there is none. A tab the layout restorer brings back (`restoring`) for a cluster that is
 * gone closes with a notification, and the restorer forgets it (the command fails).
 */
export async function showClusterTab<T extends IRefreshable>(
  app: JupyterFrontEnd,
  tabs: ClusterTabs<T>,
  id: string,
  restoring: boolean,
  create: () => MainAreaWidget<T>
): Promise<MainAreaWidget<T>> {
  const tab = tabs.find(id) ?? create();
  await openTab(app, tab);
  if (restoring && tab.content.gone) {
    const label = tab.node.dataset.slurmRayName ?? id;
    tab.dispose();
    Notification.info(goneText(tabs.kind, label), { autoClose: 8000 });
    throw new Error(`cluster ${id} is gone`);
  }
  return tab;
}
