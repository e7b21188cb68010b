/**
 * A main-area tab with a cluster's recent bootstrap events and the tail of its job output.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Widget } from '@lumino/widgets';

import { getCluster } from './api';
import { openTab, refreshableTab } from './tabs';

class LogView extends Widget {
  constructor(readonly clusterId: string) {
    super();
    this.addClass('jp-SlurmRay-logs');
    this._pre = document.createElement('pre');
    this.node.appendChild(this._pre);
  }

  async refresh(): Promise<void> {
    try {
      const details = await getCluster(this.clusterId);
      const events = details.events.map(event => JSON.stringify(event)).join('\n');
      this._pre.textContent =
        `${details.name} (${details.id}) — ${details.state}` +
        (details.reason ? ` (${details.reason})` : '') +
        `\n\n--- bootstrap events ---\n${events || '(none yet)'}` +
        `\n\n--- job output ---\n${details.log_tail || '(empty)'}`;
    } catch (error) {
      this._pre.textContent = `Could not read the logs: ${(error as Error).message}`;
    }
  }

  private _pre: HTMLPreElement;
}

/** Open a tab with the logs of cluster `id` (refreshed on open and by its toolbar button). */
export async function showLogs(app: JupyterFrontEnd, id: string, name?: string): Promise<void> {
  const tab = refreshableTab(
    new LogView(id),
    'logs',
    id,
    `Logs: ${name ?? id}`,
    'Read the logs again'
  );
  await openTab(app, tab);
}
