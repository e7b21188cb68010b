/**
 * How cluster facts read in the sidebar: walltime, state classes, owner.
 */
import { ICluster } from './api';

/** `1:02:03` from seconds; `—` when unknown. */
export function hms(seconds: number | null): string {
  if (seconds === null || seconds === undefined || seconds < 0) {
    return '—';
  }
  const s = Math.floor(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const r = s % 60;
  return `${h}:${String(m).padStart(2, '0')}:${String(r).padStart(2, '0')}`;
}

/** Walltime left now, counting down from what Slurm said at `reconciledAt` (epoch seconds). */
export function timeLeftNow(cluster: ICluster, reconciledAt: number): number | null {
  if (cluster.time_left === null) {
    return null;
  }
  const elapsed = Math.max(0, Date.now() / 1000 - reconciledAt);
  return Math.max(0, cluster.time_left - elapsed);
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
