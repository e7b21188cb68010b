/**
 * The "Slurm Ray" sidebar: every cluster with its live state, and buttons for what to do.
 *
 * It polls the server's listing (the server asks Slurm at most every few seconds, whatever
 * the number of browsers) and backs off while the server does not answer. When a cluster's
 * walltime warning becomes due it shows a notification, once per cluster.
 */
import { Notification } from '@jupyterlab/apputils';
import { CommandRegistry } from '@lumino/commands';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { ICluster, IClusterList, listClusters } from './api';
import { CommandIDs } from './commands';
import {
  canForget,
  canTakeOver,
  connectionText,
  clustersToWarn,
  hasEnded,
  hms,
  isUp,
  nodesLostText,
  ownerText,
  queueText,
  lastScalingDecision,
  liveThenEnded,
  recentTitle,
  scalingText,
  stateKind,
  timeLeftNow,
  unreachableText,
  unreadableText,
  usageShort,
  walltimeWarningText
} from './format';
import { morphChildren } from './morph';

/** What the sidebar keeps across a page reload (restore.ts), given by its plugin. */
export interface ISidebarOptions {
  /** Clusters already notified of their walltime warning (not notified again). */
  warned?: Set<string>;
  /** The first listing waits for this (the remembered state being read). */
  ready?: Promise<unknown>;
}

export class ClusterSidebar extends Widget {
  constructor(
    private readonly commands: CommandRegistry,
    options: ISidebarOptions = {}
  ) {
    super();
    this._warned = options.warned ?? new Set<string>();
    this.id = 'jp-SlurmRay-sidebar';
    this.addClass('jp-SlurmRay-sidebar');
    this.title.caption = 'Slurm Ray clusters';
    this.node.innerHTML = `
      <header class="jp-SlurmRay-header">
        <h2>Slurm Ray</h2>
        <button class="jp-SlurmRay-doctor jp-Button jp-mod-minimal">Doctor</button>
        <button class="jp-SlurmRay-refresh jp-Button jp-mod-minimal" title="Refresh now">⟳</button>
      </header>
      <div class="jp-SlurmRay-status" role="status"></div>
      <ul class="jp-SlurmRay-list"></ul>`;
    this._list = this.node.querySelector('.jp-SlurmRay-list') as HTMLUListElement;
    this._status = this.node.querySelector('.jp-SlurmRay-status') as HTMLDivElement;
    (this.node.querySelector('.jp-SlurmRay-refresh') as HTMLButtonElement).onclick = () =>
      void this.refresh();
    const doctor = this.node.querySelector('.jp-SlurmRay-doctor') as HTMLButtonElement;
    doctor.title = this.commands.caption(CommandIDs.doctor) || 'Doctor';
    doctor.onclick = () => void this.commands.execute(CommandIDs.doctor);
    this._poll = new Poll({
      factory: () => this._load(),
      frequency: { interval: 5000, backoff: true, max: 120_000 },
      standby: 'when-hidden',
      name: 'slurm-ray:clusters',
      auto: false
    });
    const ready = options.ready ?? Promise.resolve();
    void ready.catch(() => undefined).then(() => this._poll.start());
  }

  /** Seconds between two listings while the server answers. */
  set refreshInterval(seconds: number) {
    this._poll.frequency = { ...this._poll.frequency, interval: Math.max(1, seconds) * 1000 };
  }

  /** The clusters of the last listing. */
  get clusters(): ICluster[] {
    return this._last?.clusters ?? [];
  }

  /** Ask the server now (e.g. after a stop or a create). */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  /** Drop a cluster from the list now (it was forgotten), before the next listing. */
  remove(id: string): void {
    if (this._last) {
      this._last = { ...this._last, clusters: this._last.clusters.filter(c => c.id !== id) };
      this._render();
    }
  }

  dispose(): void {
    this._poll.dispose();
    window.clearInterval(this._ticker);
    super.dispose();
  }

  protected onAfterAttach(): void {
    this._ticker = window.setInterval(() => this._tick(), 1000);
  }

  protected onBeforeDetach(): void {
    window.clearInterval(this._ticker);
  }

  private async _load(): Promise<void> {
    let listing: IClusterList;
    try {
      listing = await listClusters();
      this._last = listing;
      this._status.textContent = '';
      this._status.classList.remove('jp-mod-error');
    } catch (error) {
      this._status.textContent = `Cannot list the clusters: ${(error as Error).message} (retrying)`;
      this._status.classList.add('jp-mod-error');
      throw error; // the poll backs off
    }
    this._render();
    this._warn(listing);
  }

  /** One notification per cluster whose walltime is almost over. */
  private _warn(listing: IClusterList): void {
    for (const cluster of clustersToWarn(listing.clusters, this._warned)) {
      this._warned.add(cluster.id);
      const left = timeLeftNow(cluster, listing.reconciled_at);
      const args = { id: cluster.id, name: cluster.name };
      Notification.warning(walltimeWarningText(cluster, left), {
        autoClose: false,
        actions: cluster.extendable
          ? [
              {
                label: 'Extend…',
                caption: 'Add walltime (if the site allows it)',
                callback: () => void this.commands.execute(CommandIDs.extend, args)
              }
            ]
          : []
      });
    }
  }

  /** The listing into the list; what did not change stays as it is (morph.ts says why). */
  private _render(): void {
    const listing = this._last;
    if (listing) {
      morphChildren(this._list, this._rows(listing));
    }
  }

  private _rows(listing: IClusterList): HTMLLIElement[] {
    if (listing.clusters.length === 0) {
      const empty = document.createElement('li');
      empty.className = 'jp-SlurmRay-empty';
      empty.textContent = 'No clusters yet. Start one with %slurm_ray up in a notebook.';
      return [empty];
    }
    const { live, ended } = liveThenEnded(listing.clusters);
    const rows = live.map(cluster => this._item(cluster, listing.reconciled_at));
    if (ended.length) {
      rows.push(this._recent(ended, listing.reconciled_at));
    }
    return rows;
  }

  /** The ended clusters, folded (open once the user opened it, across listings). */
  private _recent(ended: ICluster[], reconciledAt: number): HTMLLIElement {
    const group = el('li', 'jp-SlurmRay-recent') as HTMLLIElement;
    const details = document.createElement('details');
    details.open = this._recentOpen;
    details.addEventListener('toggle', () => {
      this._recentOpen = details.open;
    });
    const summary = el('summary', 'jp-SlurmRay-recentTitle', recentTitle(ended.length));
    const list = el('ul', 'jp-SlurmRay-recentList');
    for (const cluster of ended) {
      list.appendChild(this._item(cluster, reconciledAt));
    }
    details.append(summary, list);
    group.append(details);
    return group;
  }

  /** One row; a record that cannot be shown becomes a row that says so, never a broken list. */
  private _item(cluster: ICluster, reconciledAt: number): HTMLLIElement {
    try {
      return cluster.unreadable ? this._unreadable(cluster) : this._card(cluster, reconciledAt);
    } catch (error) {
      console.warn('jupyter-slurm-ray: cannot show cluster', cluster, error);
      return this._unreadable({ ...cluster, error: `cannot be shown (${error})` });
    }
  }

  private _unreadable(cluster: ICluster): HTMLLIElement {
    const item = document.createElement('li');
    item.className = 'jp-SlurmRay-cluster jp-mod-unreadable';
    item.dataset.clusterId = String(cluster.id);
    item.append(el('div', 'jp-SlurmRay-unreadableText', unreadableText(cluster)));
    const actions = el('div', 'jp-SlurmRay-actions');
    actions.append(
      this._button('Forget', CommandIDs.forget, { id: String(cluster.id) }, false, 'warn')
    );
    item.append(actions);
    return item;
  }

  private _card(cluster: ICluster, reconciledAt: number): HTMLLIElement {
    const item = document.createElement('li');
    item.className = 'jp-SlurmRay-cluster';
    item.dataset.clusterId = cluster.id;
    item.dataset.state = cluster.state;
    const ended = hasEnded(cluster);
    const title = el('div', 'jp-SlurmRay-title');
    title.append(el('span', 'jp-SlurmRay-name', cluster.name));
    const badge = el('span', `jp-SlurmRay-badge jp-mod-${stateKind(cluster.state)}`, cluster.state);
    title.append(badge);
    item.append(title);
    const unreachable = unreachableText(cluster);
    if (unreachable) {
      const note = el('div', 'jp-SlurmRay-unreachable', unreachable);
      note.title = `${cluster.state} is the last state Slurm reported`;
      item.append(note);
    }
    const queue = queueText(cluster);
    const why = cluster.reason ?? (cluster.state === 'STARTING' ? cluster.phase : null);
    if (queue) {
      const line = el('div', 'jp-SlurmRay-reason jp-SlurmRay-queue', queue);
      line.title = cluster.queue?.action ? `What to do: ${cluster.queue.action}` : queue;
      item.append(line);
    } else if (why) {
      item.append(el('div', 'jp-SlurmRay-reason', why));
    }
    if (cluster.notice && cluster.notice !== why) {
      item.append(el('div', 'jp-SlurmRay-notice', cluster.notice));
    }
    const facts = el('div', 'jp-SlurmRay-facts');
    facts.append(
      fact('Nodes', `${cluster.nodes_joined}/${cluster.nodes_wanted}`),
      fact('GPUs/node', String(cluster.gpus_per_node)),
      fact('Left', ended ? '—' : hms(timeLeftNow(cluster, reconciledAt)), 'left'),
      fact('Job', cluster.job_id ?? '—'),
      fact('Owner', ownerText(cluster))
    );
    const connection = connectionText(cluster);
    if (connection) {
      const line = fact('Connected', connection, 'connection');
      line.title = cluster.connect_reason ?? connection;
      facts.append(line);
    }
    const usage = usageShort(cluster);
    if (usage) {
      facts.append(fact('Used', usage, 'usage'));
    }
    const scaling = scalingText(cluster);
    if (scaling) {
      facts.append(el('span', 'jp-SlurmRay-scaling', scaling));
    }
    const decision = lastScalingDecision(cluster);
    if (decision) {
      const line = el('span', 'jp-SlurmRay-decision', decision);
      line.title = (cluster.scaling ?? []).join('\n');
      facts.append(line);
    }
    const lost = nodesLostText(cluster);
    if (lost) {
      facts.append(el('span', 'jp-SlurmRay-lost', lost));
    }
    item.append(facts);
    if (cluster.walltime_warning && !ended) {
      item.append(el('div', 'jp-SlurmRay-walltimeWarning', 'Walltime almost over'));
    }
    const actions = el('div', 'jp-SlurmRay-actions');
    const args = { id: cluster.id, name: cluster.name };
    actions.append(
      this._button('Dashboard', CommandIDs.openDashboard, args, !isUp(cluster.state), 'accept'),
      this._button('Stop', CommandIDs.stop, args, ended, 'warn'),
      this._button('Copy attach', CommandIDs.copyAttach, args, false),
      this._button('Logs', CommandIDs.showLogs, args, !cluster.job_id),
      this._button('Details', CommandIDs.showDetails, args, false),
      this._button('Extend', CommandIDs.extend, args, !cluster.extendable),
      this._button(
        'Scale',
        CommandIDs.scale,
        { ...args, nodes: cluster.nodes_wanted },
        !isUp(cluster.state)
      )
    );
    if (canTakeOver(cluster)) {
      actions.append(this._button('Take over', CommandIDs.takeover, args, false, 'warn'));
    }
    if (canForget(cluster)) {
      actions.append(this._button('Forget', CommandIDs.forget, args, false, 'warn'));
    }
    item.append(actions);
    return item;
  }

  private _button(
    label: string,
    command: string,
    args: any,
    disabled: boolean,
    kind: 'accept' | 'warn' | 'reject' = 'reject'
  ): HTMLButtonElement {
    const button = document.createElement('button');
    button.className = `jp-Button jp-mod-styled jp-mod-${kind} jp-SlurmRay-action`;
    button.textContent = label;
    button.dataset.command = command;
    button.dataset.args = JSON.stringify(args); // changed arguments make a changed button
    button.disabled = disabled;
    button.title = this.commands.caption(command, args) || label;
    button.onclick = () => void this.commands.execute(command, args);
    return button;
  }

  /** Count the walltime down, and Slurm's silence up, between two listings. */
  private _tick(): void {
    const listing = this._last;
    if (!listing) {
      return;
    }
    for (const cluster of listing.clusters) {
      if (cluster.unreadable) {
        continue;
      }
      const item = this._list.querySelector(`[data-cluster-id="${CSS.escape(cluster.id)}"]`);
      const left = item?.querySelector('[data-fact="left"]');
      if (left && !hasEnded(cluster)) {
        left.textContent = hms(timeLeftNow(cluster, listing.reconciled_at));
      }
      const unreachable = item?.querySelector('.jp-SlurmRay-unreachable');
      if (unreachable) {
        unreachable.textContent = unreachableText(cluster);
      }
    }
  }

  private _list: HTMLUListElement;
  private _status: HTMLDivElement;
  private _poll: Poll;
  private _last: IClusterList | null = null;
  private _recentOpen = false; // the ended clusters' group, as the user left it
  private _ticker = 0;
  private _warned: Set<string>; // clusters notified of their walltime warning
}

function el(tag: string, className: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function fact(label: string, value: string, key?: string): HTMLElement {
  const node = el('span', 'jp-SlurmRay-fact');
  node.append(el('span', 'jp-SlurmRay-factLabel', `${label} `));
  const valueNode = el('span', 'jp-SlurmRay-factValue', value);
  if (key) {
    valueNode.dataset.fact = key;
  }
  node.append(valueNode);
  return node;
}
