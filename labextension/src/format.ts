/**
 * How cluster facts read in the sidebar: durations, states, owner, lost nodes. Pure functions:
 * type-only imports here, so they are tested without JupyterLab.
 */
import type { ICluster } from './api';

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

const UP = new Set(['READY', 'CONNECTED']);
const BUSY = new Set(['SUBMITTING', 'PENDING', 'STARTING', 'STOPPING']);
const FINAL = new Set(['STOPPED', 'FAILED', 'TIMEOUT', 'CANCELLED', 'PREEMPTED', 'NODE_FAIL']);

/** A CSS modifier for the state badge: up, busy, ended or failed. */
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

/** Its record may be deleted: the server says so, or the record is unreadable. */
export const canForget = (cluster: ICluster): boolean =>
  cluster.forgettable === true || cluster.unreadable === true;

/** `unreadable record <id>: <why>`. */
export const unreadableText = (cluster: ICluster): string =>
  `unreadable record ${cluster.id}: ${cluster.error || 'no reason given'}`;

/** `alice (this server)`, `alice (kernel 123 on login1)`, `alice (gone)`. */
export function ownerText(cluster: ICluster): string {
  const who = cluster.owner || 'unknown user';
  if (cluster.server_owned) {
    return `${who} (this server)`;
  }
  if (!cluster.owner_alive) {
    return `${who} (owner gone)`;
  }
  return `${who} (pid ${cluster.owner_pid} on ${cluster.owner_host})`;
}
