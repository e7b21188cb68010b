/**
 * How cluster facts read in the sidebar: durations, states, owner, lost nodes. Pure functions:
 * type-only imports here, so they are tested without JupyterLab.
 */
import type { ICluster, IUsage, IWorkerJob } from './api';
import { BUSY, FINAL, UP } from './states';

/** `1:02:03` from seconds; `—` when unknown. */
export function hms(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || seconds < 0) {
    return '—';
  }
  const s = Math.floor(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const r = s % 60;
  return `${h}:${String(m).padStart(2, '0')}:${String(r).padStart(2, '0')}`;
}

/** A short duration: `0:45`, `12:03`, and `1:02:03` from an hour on. */
export function shortDuration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s >= 3600) {
    return hms(s);
  }
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

/** Walltime left now, counting down from what Slurm said at `reconciledAt` (epoch seconds). */
export function timeLeftNow(
  cluster: ICluster,
  reconciledAt: number,
  nowSeconds: number = Date.now() / 1000
): number | null {
  if (cluster.time_left === null || cluster.time_left === undefined) {
    return null;
  }
  const elapsed = Math.max(0, nowSeconds - reconciledAt);
  return Math.max(0, cluster.time_left - elapsed);
}

/** `Slurm not answering for 0:45` while Slurm does not answer for the cluster, else null. */
export function unreachableText(
  cluster: ICluster,
  nowSeconds: number = Date.now() / 1000
): string | null {
  const since = cluster.slurm_unreachable_since;
  if (typeof since !== 'number') {
    return null;
  }
  return `Slurm not answering for ${shortDuration(nowSeconds - since)}`;
}

/** `node2 lost`, `node2, node3 lost`, or null when no node was lost. */
export function nodesLostText(cluster: ICluster): string | null {
  const lost = Array.isArray(cluster.nodes_lost) ? cluster.nodes_lost : [];
  return lost.length ? `${lost.join(', ')} lost` : null;
}

/** A CSS modifier for the state badge: up, busy, ended or failed. */
/**
 * `2/3 nodes alive · worker jobs: 1 running, 1 pending (Resources)`, by group when there are
 * others than the default (`… worker jobs: default: 1 running; gpu: 1 pending (Resources, est.
 * start 2026-12-01 14:05)`); null without any.
 */
export function scalingText(cluster: ICluster): string | null {
  const jobs = cluster.worker_jobs ?? [];
  if (jobs.length === 0 || cluster.final) {
    return null;
  }
  const alive = `${cluster.nodes_joined}/${cluster.nodes_wanted} nodes alive`;
  const groupOf = (job: IWorkerJob): string => job.group || 'default';
  const groups = [...new Set(jobs.map(groupOf))].sort((a, b) =>
    a === 'default' ? -1 : b === 'default' ? 1 : a.localeCompare(b)
  );
  if (groups.length === 1 && groups[0] === 'default') {
    return `${alive} · worker jobs: ${workerJobsText(jobs)}`;
  }
  const parts = groups.map(
    group => `${group}: ${workerJobsText(jobs.filter(job => groupOf(job) === group))}`
  );
  return `${alive} · worker jobs: ${parts.join('; ')}`;
}

/** `1 running, 2 pending (Priority, Resources, est. start 2026-12-01 14:05)`. */
function workerJobsText(jobs: IWorkerJob[]): string {
  const pending = jobs.filter(job => job.state === 'PENDING');
  const reasons = [...new Set(pending.map(job => job.reason || 'no reason yet'))].sort();
  const starts = pending.map(job => job.estimated_start).filter(Boolean) as string[];
  if (starts.length) {
    reasons.push(`est. start ${starts.sort()[0]}`);
  }
  const waiting = pending.length ? `, ${pending.length} pending (${reasons.join(', ')})` : '';
  return `${jobs.length - pending.length} running${waiting}`;
}

/** `Ray driver` or `Ray Client`: how the owner's kernel is connected; null when it is not. */
export function connectionText(cluster: ICluster): string | null {
  if (cluster.state !== 'CONNECTED' || !cluster.connect_mode) {
    return null;
  }
  return cluster.connect_mode === 'driver' ? 'Ray driver' : 'Ray Client';
}

/** The last scaling decision with its cause, for the card (all of them: the title). */
export function lastScalingDecision(cluster: ICluster): string | null {
  const lines = cluster.scaling ?? [];
  return lines.length && !cluster.final ? lines[lines.length - 1] : null;
}

export function stateKind(state: string): string {
  if (UP.has(state)) {
    return 'up';
  }
  if (BUSY.has(state)) {
    return 'busy';
  }
  return state === 'STOPPED' || state === 'CANCELLED' ? 'ended' : 'failed';
}

export const isFinal = (state: string): boolean => FINAL.has(state);
export const isUp = (state: string): boolean => UP.has(state);

/** It ended: the server says so (`final`), or its state is a final one. */
export const hasEnded = (cluster: ICluster): boolean =>
  cluster.final === true || isFinal(cluster.state);

/**
 * The sidebar's two parts, newest first: live clusters (and unreadable records, which may be
 * alive), then the ended ones, folded under a "recent" group.
 */
export function liveThenEnded(clusters: ICluster[]): { live: ICluster[]; ended: ICluster[] } {
  const newestFirst = [...clusters].reverse();
  const ended = newestFirst.filter(c => !c.unreadable && hasEnded(c));
  return { live: newestFirst.filter(c => !ended.includes(c)), ended };
}

/** The folded group's title: `Recent: 3 ended`. */
export const recentTitle = (ended: number): string => `Recent: ${ended} ended`;

/** Its record may be deleted: the server says so, or the record is unreadable. */
export const canForget = (cluster: ICluster): boolean =>
  cluster.forgettable === true || cluster.unreadable === true;

/** `unreadable record <id>: <why>`. */
export const unreadableText = (cluster: ICluster): string =>
  `unreadable record ${cluster.id}: ${cluster.error || 'no reason given'}`;

/**
 * `alice (this server)`, `alice (pid 123 on login1)`, `alice (owner gone)`, and how many other
 * processes observe it: `alice (pid 123 on login1) · 1 observing`.
 */
export function ownerText(cluster: ICluster): string {
  const who = cluster.owner || 'unknown user';
  let owner = `${who} (pid ${cluster.owner_pid} on ${cluster.owner_host})`;
  if (cluster.server_owned) {
    owner = `${who} (this server)`;
  } else if (!cluster.owner_alive) {
    owner = `${who} (owner gone)`;
  }
  const observing = (cluster.observers ?? []).length;
  return observing ? `${owner} · ${observing} observing` : owner;
}

/** `pid 123 on login1`, or `this server`: who owns a cluster, for a sentence. */
export function ownerName(cluster: ICluster): string {
  return cluster.server_owned
    ? 'this server'
    : `pid ${cluster.owner_pid} on ${cluster.owner_host || 'an unknown host'}`;
}

/** Whether the Take over button is offered: active, and owned by another process. */
export const canTakeOver = (cluster: ICluster): boolean =>
  cluster.can_take_over === true && !hasEnded(cluster) && !cluster.server_owned;

/** `1.2 GiB` from bytes; `—` when unknown. */
export function bytesText(bytes: number | null | undefined): string {
  if (typeof bytes !== 'number' || bytes < 0) {
    return '—';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

/** `0`, `0.012`, `0.12`, `4`, `12.3`: hours with two significant figures below 10. */
export function hoursText(hours: number): string {
  if (!hours) {
    return '0';
  }
  return hours >= 10 ? hours.toFixed(1) : String(Number(hours.toPrecision(2)));
}

/** The listing's usage in a few words: `0.12 CPU-h · 1 GPU-h · 34 % CPU`; null without any. */
export function usageShort(cluster: ICluster): string | null {
  const usage = cluster.usage;
  if (!usage) {
    return null;
  }
  if (!usage.available) {
    return 'no accounting';
  }
  const parts = [`${hoursText(usage.cpu_hours)} CPU-h`];
  if (usage.gpu_hours > 0) {
    parts.push(`${hoursText(usage.gpu_hours)} GPU-h`);
  }
  if (typeof usage.cpu_efficiency === 'number') {
    parts.push(`${Math.round(usage.cpu_efficiency * 100)} % CPU`);
  }
  return parts.join(' · ');
}

/**
 * The details' usage line, from the figures: `used 0.1 CPU-hours, 0 GPU-hours, CPU efficiency
 * 34 %, max RSS 1.2 GiB on node1`, or what is unavailable and why (the notebook says the same
 * in its words: ui/formatting.py's usage_summary).
 */
export function usageSummary(usage: IUsage): string {
  if (!usage.available) {
    return `usage unavailable: ${usage.unavailable ?? 'no accounting'}`;
  }
  const parts = [
    `used ${hoursText(usage.cpu_hours)} CPU-hours`,
    `${hoursText(usage.gpu_hours)} GPU-hours`
  ];
  const efficiency = usage.cpu_efficiency;
  if (typeof efficiency === 'number') {
    parts.push(`CPU efficiency ${Math.round(efficiency * 100)} %`);
  }
  const peak = usage.max_rss;
  if (typeof peak === 'number') {
    parts.push(
      `max RSS ${bytesText(peak)}${usage.max_rss_node ? ` on ${usage.max_rss_node}` : ''}`
    );
  }
  if (!usage.final) {
    const soFar = typeof usage.elapsed === 'number' ? `in ${hms(usage.elapsed)} so far` : 'so far';
    parts.push(`${soFar} (efficiency and memory when it ends)`);
  } else if (typeof efficiency !== 'number' || typeof peak !== 'number') {
    const missing = [
      typeof efficiency !== 'number' ? 'CPU efficiency' : null,
      typeof peak !== 'number' ? 'max RSS' : null
    ].filter(Boolean);
    parts.push(`${missing.join(' and ')} not recorded by Slurm`);
  }
  return parts.join(', ');
}

/** `YYYY-MM-DD HH:MM` (local time) of an ISO timestamp from Slurm; null when there is none. */
export function startText(iso: string | null | undefined): string | null {
  if (!iso) {
    return null;
  }
  const match = /^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2})/.exec(iso);
  return match ? `${match[1]} ${match[2]}` : iso;
}

/** A pending cluster's reason in plain words and what it waits for; null when not pending. */
export function queueText(cluster: ICluster): string | null {
  const queue = cluster.queue;
  if (!queue || cluster.state !== 'PENDING') {
    return null;
  }
  const parts = [`${queue.reason}: ${queue.meaning}`];
  if (queue.hint) {
    parts.push(queue.hint);
  }
  const start = startText(queue.estimated_start ?? cluster.estimated_start);
  if (start) {
    parts.push(`est. start ${start}`);
  }
  return parts.join(' · ');
}

/**
 * The clusters to notify about now: their walltime warning is due, they still run, and they
 * were not notified before (`warned` holds their ids).
 */
export function clustersToWarn(clusters: ICluster[], warned: Set<string>): ICluster[] {
  return clusters.filter(
    c => !c.unreadable && c.walltime_warning === true && !hasEnded(c) && !warned.has(c.id)
  );
}

/** `Slurm Ray: analysis's walltime is almost over (0:01:12 left).` */
export function walltimeWarningText(cluster: ICluster, left: number | null): string {
  const job = cluster.job_id ? ` (job ${cluster.job_id})` : '';
  return `Slurm Ray: the walltime of ${cluster.name}${job} is almost over: ${hms(left)} left. Save your work, or extend it.`;
}

/** The details view's rows: label and text, in order (pure: rendered by details.ts). */
export function detailRows(cluster: ICluster, leftNow: number | null): Array<[string, string]> {
  const rows: Array<[string, string]> = [
    ['State', cluster.state + (cluster.reason ? ` (${cluster.reason})` : '')]
  ];
  const queue = cluster.queue;
  if (queue && cluster.state === 'PENDING') {
    rows.push(['Why it waits', `${queue.reason}: ${queue.meaning}`]);
    if (queue.hint) {
      rows.push(['Waiting for', queue.hint]);
    }
    rows.push(['Estimated start', startText(queue.estimated_start) ?? 'not known yet']);
    if (queue.action) {
      rows.push([
        'What to do',
        queue.action + (queue.never_starts ? ' (as asked, it never starts)' : '')
      ]);
    }
  }
  if (!hasEnded(cluster)) {
    const warn = cluster.walltime_warning ? ' — almost over' : '';
    rows.push(['Walltime left', `${hms(leftNow)} of ${hms(cluster.time_limit)}${warn}`]);
  }
  const where = [
    cluster.partition ? `partition ${cluster.partition}` : null,
    cluster.account ? `account ${cluster.account}` : null,
    cluster.qos ? `QOS ${cluster.qos}` : null
  ].filter(Boolean);
  if (where.length) {
    rows.push(['Charged to', where.join(', ')]);
  }
  const usage = cluster.usage;
  if (usage) {
    rows.push(['Usage', usageSummary(usage)]);
    if (usage.available) {
      rows.push(['CPU-hours allocated', hoursText(usage.cpu_hours)]);
      rows.push(['GPU-hours allocated', hoursText(usage.gpu_hours)]);
      rows.push([
        'CPU efficiency',
        typeof usage.cpu_efficiency === 'number'
          ? `${Math.round(usage.cpu_efficiency * 100)} %`
          : 'when the job ends'
      ]);
      for (const [node, rss] of Object.entries(usage.max_rss_by_node ?? {})) {
        rows.push([`Max RSS on ${node}`, bytesText(rss)]);
      }
    }
  }
  return rows;
}
