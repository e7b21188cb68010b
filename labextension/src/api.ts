/**
 * The server extension's REST API (`slurm-ray/api/clusters`), typed.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { IDoctorReport } from './doctor';

/**
 * One cluster as the server reports it (registry record reconciled with Slurm): the REST
 * view's `ClusterView` (jupyter_slurm_ray/server/views.py), checked field by field by a test.
 * An unreadable record's row has only `id`, `unreadable`, `error`, `state`, `final` and
 * `forgettable`.
 */
export interface ICluster {
  id: string;
  name: string;
  state: string;
  reason: string | null;
  phase: string | null;
  job_id: string | null;
  slurm_state: string | null;
  nodes: string[];
  nodes_wanted: number;
  nodes_joined: number;
  gpus_per_node: number;
  time_limit: number | null;
  time_left: number | null;
  estimated_start: string | null;
  owner: string;
  owner_host: string;
  owner_pid: number;
  owner_alive: boolean;
  /** One more at every change of owner (a takeover). */
  owner_term: number;
  /** The processes that watch the cluster without owning it (their exit leaves it running). */
  observers: IObserver[];
  /** This server owns the cluster (it created it, or took it over). */
  server_owned: boolean;
  /** It is active and this server does not own it: `takeoverCluster` may make it the owner. */
  can_take_over: boolean;
  detached: boolean;
  target: string;
  attach_command: string;
  /** The dashboard through this server (added by the REST handlers). */
  dashboard_url?: string;
  /** Its target is one this server reaches (else it is shown as recorded). */
  reachable: boolean;
  /** Epoch seconds. */
  created_at: number;
  updated_at: number;
  /** Epoch seconds since which Slurm has not answered for it (the state is the last known). */
  slurm_unreachable_since: number | null;
  /** Something the server wants the user to know about the cluster (e.g. Slurm's silence). */
  notice: string | null;
  /** Hosts that were part of the cluster and are gone. */
  nodes_lost: string[];
  /** Its extra worker jobs (scaling) Slurm may still run. */
  worker_jobs: IWorkerJob[];
  /** The last scaling decisions with their cause (adapt's settings first while it runs). */
  scaling: string[];
  /** How the owner's kernel is connected while CONNECTED: a Ray driver on its own host's Ray
   * node, or Ray Client through the head. */
  connect_mode: 'driver' | 'client' | null;
  /** Why that way (`auto: this kernel runs in Slurm job 12 on node1; …`). */
  connect_reason: string | null;
  /** It ended: nothing runs any more. */
  final: boolean;
  /** Its record may be deleted (`forgetCluster`). */
  forgettable: boolean;
  /** The record file could not be read: only `id` (and `error`) mean something. */
  unreadable: boolean;
  error: string | null;
  /** The walltime is almost over (the job's SIGUSR1 event, or Slurm's time left). */
  walltime_warning: boolean;
  /** How long before the end the job is warned (its `walltime_warning` setting), seconds. */
  walltime_warning_seconds: number;
  /** Its time limit can be raised (`extendCluster`): it is still active. */
  extendable: boolean;
  partition: string | null;
  account: string | null;
  qos: string | null;
  /** Why a PENDING cluster waits, in plain words (null otherwise). */
  queue: IQueueInsight | null;
  /** What its Slurm jobs used: compact in the listing (`?usage=true`), full in details. */
  usage?: IUsage | null;
}

/** A process that observes a cluster (a kernel that attached it while its owner lived). */
export interface IObserver {
  pid: number;
  host: string;
}

/** Slurm's pending reason explained, what to do, and what it waits for. */
export interface IQueueInsight {
  reason: string;
  meaning: string;
  action: string | null;
  /** As requested, Slurm will never start it (e.g. over a QOS limit). */
  never_starts: boolean;
  hint: string | null;
  estimated_start: string | null;
}

/** Usage from sacct. The listing carries the first six fields only. */
export interface IUsage {
  available: boolean;
  final: boolean;
  cpu_hours: number;
  gpu_hours: number;
  /** CPU time used over allocated, 0..1; null until the jobs ended. */
  cpu_efficiency: number | null;
  /** The largest RSS of any node, bytes. */
  max_rss: number | null;
  unavailable?: string | null;
  job_ids?: string[];
  elapsed?: number;
  cpu_used_seconds?: number;
  max_rss_by_node?: Record<string, number>;
  max_rss_node?: string | null;
}

/** The listing, with the time Slurm was last asked. */
export interface IClusterList {
  clusters: ICluster[];
  reconciled_at: number;
  slurm_queries: number;
}

/** One cluster with its recent bootstrap events and the tail of its job output. */
/** One extra worker job of a cluster (scaling): Slurm's state and pending reason, its node. */
export interface IWorkerJob {
  job_id: string;
  state: string;
  reason: string | null;
  host: string | null;
  joined: boolean;
  /** Slurm's estimated start while PENDING (`YYYY-MM-DD HH:MM`), when it has one. */
  estimated_start?: string | null;
  /** Its worker group (`default` for the cluster's own shape). */
  group?: string;
}

export interface IClusterDetails extends ICluster {
  events: Array<Record<string, unknown>>;
  log_tail: string;
}

/** An error answered by the API: its message, and the input field at fault if any. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly field: string | null = null
  ) {
    super(message);
  }
}

const settings = (): ServerConnection.ISettings => ServerConnection.makeSettings();

async function request<T>(
  path: string,
  init: RequestInit = {},
  prefix = 'slurm-ray/api/clusters',
  query = ''
): Promise<T> {
  const s = settings();
  const url = URLExt.join(s.baseUrl, prefix, path) + query;
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, s);
  } catch (error) {
    throw new ApiError(`the Jupyter server did not answer: ${error}`, 0);
  }
  const text = await response.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { message: text };
  }
  if (!response.ok) {
    throw new ApiError(data?.message ?? response.statusText, response.status, data?.field ?? null);
  }
  return data as T;
}

/** Every cluster, each with the compact form of its usage. */
export const listClusters = (): Promise<IClusterList> =>
  request<IClusterList>('', {}, undefined, '?usage=true');

export const getCluster = (id: string, tail = 200): Promise<IClusterDetails> =>
  request<IClusterDetails>(`${encodeURIComponent(id)}?tail=${tail}&events=100`);

export const stopCluster = (id: string): Promise<ICluster> =>
  request<ICluster>(encodeURIComponent(id), { method: 'DELETE' });

/** Delete the record of an ended (or unreadable) cluster; 409 while it is still active. */
export const forgetCluster = (id: string): Promise<unknown> =>
  request<unknown>(`${encodeURIComponent(id)}?forget=true`, { method: 'DELETE' });

/**
 * Add walltime (`+30` minutes, or a Slurm duration like `+1:00:00`). A 403 carries Slurm's
 * refusal and what to do; the answer has the new `time_left`.
 */
export const extendCluster = (id: string, amount: string): Promise<ICluster> =>
  request<ICluster>(`${encodeURIComponent(id)}/extend`, {
    method: 'POST',
    body: JSON.stringify({ amount })
  });

/**
 * Scale to `nodes` Ray nodes in all (the head's allocation plus one-node worker jobs). 200 when
 * this server owns the cluster, 202 when its owner was asked (`applied` false); 400 names
 * `nodes` when the count is not allowed.
 */
export const scaleCluster = (id: string, nodes: number): Promise<ICluster & { applied: boolean }> =>
  request<ICluster & { applied: boolean }>(`${encodeURIComponent(id)}/scale`, {
    method: 'POST',
    body: JSON.stringify({ nodes })
  });

/**
 * Make this Jupyter server the cluster's owner: it keeps its lease and cancels it when the
 * server stops (unless detached); the previous owner stands down at its next lease renewal
 * and says who owns the cluster now. 409 when the cluster is no longer active.
 */
export const takeoverCluster = (id: string): Promise<ICluster> =>
  request<ICluster>(`${encodeURIComponent(id)}/takeover`, { method: 'POST' });

export const createCluster = (settings: Record<string, unknown>): Promise<ICluster> =>
  request<ICluster>('', { method: 'POST', body: JSON.stringify(settings) });

/**
 * The sandboxed URL of a cluster's dashboard: `<base>slurm-ray/dashboard/<id>/~<capability>/`,
 * valid in this server process only (see the server's `proxy.py`).
 */
export async function dashboardLink(id: string): Promise<string> {
  const link = await request<{ url: string }>(
    encodeURIComponent(id),
    { method: 'POST' },
    'slurm-ray/dashboard-links'
  );
  return link.url;
}

/** The doctor's checklist: one short test job on a compute node (about a few seconds when
 * the queue is empty; the server gives up after `queueTimeout` s in the queue). */
export async function runDoctor(profile = '', queueTimeout = 120): Promise<IDoctorReport> {
  const query =
    `?queue_timeout=${queueTimeout}` + (profile ? `&profile=${encodeURIComponent(profile)}` : '');
  return request<IDoctorReport>('', {}, 'slurm-ray/api/doctor', query);
}
