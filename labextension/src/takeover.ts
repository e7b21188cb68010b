/**
 * Taking a cluster over from the sidebar or the palette: ask, take over, tell. Pure (the
 * dialogs and the request are passed in), so it is tested without JupyterLab.
 */
import type { ICluster } from './api';
import { ownerName } from './format';

/** What taking over needs from JupyterLab and the server. */
export interface ITakeoverSteps {
  /** Whether the user confirmed (`title`, `body`, the button's `action` label). */
  confirm: (title: string, body: string, action: string) => Promise<boolean>;
  /** `POST clusters/<id>/takeover`: the cluster as the server owns it now. */
  takeover: (id: string) => Promise<ICluster>;
  success: (message: string) => void;
  failure: (title: string, message: string) => Promise<unknown>;
  refresh: () => Promise<void>;
}

/** The confirmation's text: who owns it now, and what changes for both. */
export function takeoverWarning(label: string, current?: ICluster): string {
  const owner = current ? ownerName(current) : 'another process';
  return (
    `${label} is owned by ${owner}. This Jupyter server becomes its owner: it keeps the ` +
    'cluster alive and cancels it when the server stops (unless detached). The previous ' +
    'owner stops renewing its lease, scaling it and cancelling it at exit, and is told ' +
    'who owns it now; its Ray connection keeps working.'
  );
}

/**
 * Ask, then take the cluster over; tell the outcome and refresh the list. True when taken.
 * `current` is the cluster as last listed (for the owner's name), when known.
 */
export async function takeOver(
  id: string,
  label: string,
  current: ICluster | undefined,
  steps: ITakeoverSteps
): Promise<boolean> {
  const title = 'Take over the cluster?';
  if (!(await steps.confirm(title, takeoverWarning(label, current), 'Take over'))) {
    return false;
  }
  let taken = false;
  try {
    const owned = await steps.takeover(id);
    const before = current && !current.server_owned ? ` (was ${ownerName(current)})` : '';
    steps.success(`${label} is owned by ${ownerName(owned)} now${before}.`);
    taken = true;
  } catch (error) {
    const inactive = (error as { status?: number }).status === 409;
    await steps.failure(
      inactive ? `${label} is no longer active` : 'Could not take the cluster over',
      (error as Error).message
    );
  }
  await steps.refresh();
  return taken;
}
