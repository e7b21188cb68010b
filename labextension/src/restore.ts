/**
 * What a page reload keeps of a cluster's tabs (its dashboard, logs and details): the cluster's
 * id and name, never a URL. The dashboard's capability URL is minted per server process, so a
 * restored dashboard asks for a new one. A tab whose cluster is gone is not restored: a short
 * notification says why. Pure, so it is tested without JupyterLab.
 */

/** The kinds of cluster tabs; each is one tracker, `slurm-ray-<kind>` in the state DB. */
export type TabKind = 'dashboard' | 'logs' | 'details';

const TITLES: Record<TabKind, string> = {
  dashboard: 'Ray dashboard',
  logs: 'Logs',
  details: 'Details'
};

/** The state-DB namespace of the tabs of `kind` (the layout names them `<namespace>:<id>`). */
export function tabNamespace(kind: TabKind): string {
  return `slurm-ray-${kind}`;
}

/** The main-area id of the tab of `kind` for cluster `id` (one tab per cluster and kind). */
export function tabId(kind: TabKind, id: string): string {
  return `${tabNamespace(kind)}-${id}`;
}

/** The arguments the layout restorer keeps, and runs the tab's command with after a reload. */
export interface IRestoreArgs {
  [key: string]: string | boolean;
  id: string;
  /** The command runs for a restored tab: a failure is a notification, not a dialog. */
  restored: true;
}

/** What the state DB keeps of the tab of cluster `id` (named `name` when known). */
export function restoreArgs(id: string, name?: string): IRestoreArgs {
  return name ? { id, name, restored: true } : { id, restored: true };
}

/** Whether a command runs for a tab the layout restorer brings back. */
export function isRestoring(args: Record<string, unknown>): boolean {
  return args.restored === true;
}

/** Whether the server's answer says the cluster is gone (404: no such record any more). */
export function isGone(error: unknown): boolean {
  return (
    typeof error === 'object' && error !== null && (error as { status?: unknown }).status === 404
  );
}

/** The notification in place of a restored tab that could not be brought back. */
export function notRestoredText(kind: TabKind, cluster: string, error: unknown): string {
  const why = isGone(error)
    ? 'the cluster is no longer in the registry (forgotten)'
    : `the server said: ${error instanceof Error ? error.message : String(error)}`;
  return `Slurm Ray: the ${TITLES[kind]} tab of ${cluster} was closed after the reload: ${why}.`;
}

/** The notification in place of a restored tab whose cluster is gone. */
export function goneText(kind: TabKind, cluster: string): string {
  return notRestoredText(kind, cluster, { status: 404 });
}

/** The sidebar's entry in the state DB. */
export const SIDEBAR_STATE_KEY = 'jupyter-slurm-ray:sidebar';

/** At most this many clusters are remembered as warned (the newest). */
export const MAX_WARNED = 100;

/** What the sidebar keeps across a reload: the clusters already told their walltime is
 * almost over, so that a reload does not notify them again. */
export interface ISidebarState {
  [key: string]: string[];
  warned: string[];
}

/** The state to save for the clusters in `warned` (insertion order, the newest kept). */
export function sidebarState(warned: Iterable<string>): ISidebarState {
  return { warned: [...warned].slice(-MAX_WARNED) };
}

/** The warned clusters in a saved state; nothing from a state that is not one. */
export function warnedIn(saved: unknown): string[] {
  const warned = (saved as { warned?: unknown } | null | undefined)?.warned;
  return Array.isArray(warned) ? warned.filter((id): id is string => typeof id === 'string') : [];
}
