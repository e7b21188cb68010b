/**
 * A main-area tab with a cluster's recent bootstrap events and the tail of its job output.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { MainAreaWidget } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { getCluster } from './api';
import { isGone } from './restore';
import { ClusterTabs, refreshableTab, showClusterTab } from './tabs';

export class LogView extends Widget {
  constructor(readonly clusterId: string) {
    super();
    this.addClass('jp-SlurmRay-logs');
    this._pre = document.createElement('pre');
    this.node.appendChild(this._pre);
  }

  get gone(): boolean {
    return this._gone;
  }

  async refresh(): Promise<void> {
    try {
      const details = await getCluster(this.clusterId);
      this._gone = false;
      const events = details.events.map(event => JSON.stringify(event)).join('\n');
      this._pre.textContent =
        `${details.name} (${details.id}) — ${details.state}` +
        (details.reason ? ` (${details.reason})` : '') +
        `\n\n--- bootstrap events ---\n${events || '(none yet)'}` +
        `\n\n--- job output ---\n${details.log_tail || '(empty)'}`;
    } catch (error) {
      this._gone = isGone(error);
      this._pre.textContent = `Could not read the logs: ${(error as Error).message}`;
    }
  }

  private _pre: HTMLPreElement;
  private _gone = false;
}

/** The logs tabs, one per cluster. */
export type LogTabs = ClusterTabs<LogView>;

/**
 * Open (or bring forward) the logs tab of cluster `id` and read the logs; `restoring` when the
 * layout restorer brings it back after a reload (see tabs.ts).
 */
export async function showLogs(
  app: JupyterFrontEnd,
  tabs: LogTabs,
  id: string,
  name?: string,
  restoring = false
): Promise<MainAreaWidget<LogView>> {
  return showClusterTab(app, tabs, id, restoring, () =>
    refreshableTab(tabs, new LogView(id), id, name, `Logs: ${name ?? id}`, 'Read the logs again')
  );
}
