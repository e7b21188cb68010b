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
import { IFrame, MainAreaWidget, showErrorMessage } from '@jupyterlab/apputils';

import { dashboardLink } from './api';

/** Everything the dashboard needs, and nothing that joins it to Jupyter's origin. */
export const DASHBOARD_SANDBOX: IFrame.SandboxExceptions[] = [
  'allow-scripts',
  'allow-forms',
  'allow-popups',
  'allow-downloads'
];

const tabs = new Map<string, MainAreaWidget<IFrame>>();

/** Open (or bring forward) the dashboard tab of cluster `id`; null when it cannot be. */
export async function openDashboard(
  app: JupyterFrontEnd,
  id: string,
  name?: string
): Promise<MainAreaWidget<IFrame> | null> {
  let tab = tabs.get(id);
  if (!tab || tab.isDisposed) {
    let url: string;
    try {
      url = await dashboardLink(id);
    } catch (error) {
      await showErrorMessage(
        `Cannot open the dashboard of ${name ?? id}`,
        (error as Error).message
      );
      return null;
    }
    tab = tabs.get(id); // opened meanwhile (a double click)
    if (!tab || tab.isDisposed) {
      tab = createTab(id, name, url);
    }
  }
  if (!tab.isAttached) {
    app.shell.add(tab, 'main');
  }
  app.shell.activateById(tab.id);
  return tab;
}

function createTab(id: string, name: string | undefined, url: string): MainAreaWidget<IFrame> {
  const frame = new IFrame({ sandbox: DASHBOARD_SANDBOX, referrerPolicy: 'no-referrer' });
  frame.url = url;
  const tab = new MainAreaWidget({ content: frame });
  tab.id = `slurm-ray-dashboard-${id}`;
  tab.title.label = `Ray: ${name ?? id}`;
  tab.title.caption = `Ray dashboard of ${name ?? id} (${id})`;
  tab.title.closable = true;
  tab.addClass('jp-SlurmRay-dashboardTab');
  tab.node.dataset.slurmRayCluster = id;
  tabs.set(id, tab);
  tab.disposed.connect(() => tabs.delete(id));
  return tab;
}
