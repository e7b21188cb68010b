/**
 * The Ray dashboard of a cluster in a main-area tab: a sandboxed IFrame of the proxy.
 *
 * Why the sandbox has `allow-scripts` but NOT `allow-same-origin`: the dashboard is a web app
 * from the cluster side, and with both flags on Jupyter's origin its scripts could act as the
 * user on Jupyter's API (read files, start kernels). Instead the frame loads a capability URL
 * (`<base>slurm-ray/dashboard/<id>/~<capability>/`, minted by `POST
 * slurm-ray/dashboard-links/<id>` for the logged-in user, valid in this server process only):
 * the capability, not Jupyter's cookie, authorizes the dashboard's requests, so it works in an
 * opaque origin, which has no access to Jupyter's cookies, storage, API or this page. The
 * server also sends `Content-Security-Policy: sandbox …` with its pages (the same opaque
 * origin when the URL is opened in a browser tab) and gives them an in-memory localStorage
 * (the dashboard reads it at start; an opaque origin throws). `no-referrer`: the capability
 * never leaves in a Referer header. The Ray token never reaches the page; the server adds it.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { IFrame, MainAreaWidget, Notification, showErrorMessage } from '@jupyterlab/apputils';

import { dashboardLink } from './api';
import { notRestoredText } from './restore';
import { ClusterTabs } from './tabs';

/** Everything the dashboard needs, and nothing that joins it to Jupyter's origin. */
export const DASHBOARD_SANDBOX: IFrame.SandboxExceptions[] = [
  'allow-scripts',
  'allow-forms',
  'allow-popups',
  'allow-downloads'
];

/** The dashboard tabs, one per cluster. */
export type DashboardTabs = ClusterTabs<IFrame>;

/**
 * Open (or bring forward) the dashboard tab of cluster `id`; null when it cannot be. A tab the
 * layout restorer brings back (`restoring`) gets a fresh capability URL; when there is none
 * (the cluster is gone) a notification says so and the command fails, so the restorer forgets
 * the tab instead of showing a broken frame.
 */
export async function openDashboard(
  app: JupyterFrontEnd,
  tabs: DashboardTabs,
  id: string,
  name?: string,
  restoring = false
): Promise<MainAreaWidget<IFrame> | null> {
  let tab = tabs.find(id);
  if (!tab) {
    let url: string;
    try {
      url = await dashboardLink(id);
    } catch (error) {
      if (restoring) {
        Notification.info(notRestoredText('dashboard', name ?? id, error), { autoClose: 8000 });
        throw error;
      }
      await showErrorMessage(
        `Cannot open the dashboard of ${name ?? id}`,
        (error as Error).message
      );
      return null;
    }
    tab = tabs.find(id) ?? createTab(tabs, id, name, url); // or opened meanwhile (a double click)
  }
  if (!tab.isAttached) {
    app.shell.add(tab, 'main');
  }
  app.shell.activateById(tab.id);
  return tab;
}

function createTab(
  tabs: DashboardTabs,
  id: string,
  name: string | undefined,
  url: string
): MainAreaWidget<IFrame> {
  const frame = new IFrame({ sandbox: DASHBOARD_SANDBOX, referrerPolicy: 'no-referrer' });
  frame.url = url;
  const tab = new MainAreaWidget({ content: frame });
  tab.title.label = `Ray: ${name ?? id}`;
  tab.title.caption = `Ray dashboard of ${name ?? id} (${id})`;
  tab.title.closable = true;
  tab.addClass('jp-SlurmRay-dashboardTab');
  tabs.track(tab, id, name); // id slurm-ray-dashboard-<cluster>
  return tab;
}
