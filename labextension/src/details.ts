/**
 * A main-area tab with one cluster's details: why it waits (Slurm's reason in plain words,
 * estimated start, what to do), its walltime, and what it used (sacct), with Extend.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { MainAreaWidget, ToolbarButton } from '@jupyterlab/apputils';
import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';

import { getCluster } from './api';
import { detailRows, timeLeftNow } from './format';
import { isGone } from './restore';
import { ClusterTabs, refreshableTab, showClusterTab } from './tabs';

export class DetailsView extends Widget {
  constructor(readonly clusterId: string) {
    super();
    this.addClass('jp-SlurmRay-details');
    this._title = document.createElement('h3');
    this._table = document.createElement('table');
    this.node.append(this._title, this._table);
  }

  get gone(): boolean {
    return this._gone;
  }

  async refresh(): Promise<void> {
    try {
      const details = await getCluster(this.clusterId, 20);
      this._gone = false;
      const left = timeLeftNow(details, Date.now() / 1000);
      this._title.textContent = `${details.name} (${details.id}), job ${details.job_id ?? '—'}`;
      this._table.replaceChildren();
      for (const [label, value] of detailRows(details, left)) {
        const row = document.createElement('tr');
        const th = document.createElement('th');
        th.textContent = label;
        const td = document.createElement('td');
        td.textContent = value;
        row.append(th, td);
        this._table.append(row);
      }
    } catch (error) {
      this._gone = isGone(error);
      this._title.textContent = `Could not read the cluster: ${(error as Error).message}`;
    }
  }

  private _title: HTMLHeadingElement;
  private _table: HTMLTableElement;
  private _gone = false;
}

/** The details tabs, one per cluster. */
export type DetailTabs = ClusterTabs<DetailsView>;

/**
 * Open (or bring forward) the details tab of cluster `id`, read on open and by its toolbar;
 * `restoring` when the layout restorer brings it back after a reload (see tabs.ts).
 */
export async function showDetails(
  app: JupyterFrontEnd,
  tabs: DetailTabs,
  id: string,
  name: string | undefined,
  extendCommand: string,
  commands: CommandRegistry,
  restoring = false
): Promise<MainAreaWidget<DetailsView>> {
  return showClusterTab(app, tabs, id, restoring, () => {
    const view = new DetailsView(id);
    const tab = refreshableTab(
      tabs,
      view,
      id,
      name,
      `Cluster: ${name ?? id}`,
      'Ask the server again'
    );
    tab.toolbar.addItem(
      'extend',
      new ToolbarButton({
        label: 'Extend…',
        tooltip: 'Add walltime (scontrol update TimeLimit=+N)',
        onClick: () =>
          void commands.execute(extendCommand, { id, name: name ?? id }).then(() => view.refresh())
      })
    );
    return tab;
  });
}
