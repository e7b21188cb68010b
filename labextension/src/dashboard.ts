/**
 * The Ray dashboard of a cluster in a main-area tab: an IFrame of the authenticated proxy.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { IFrame, MainAreaWidget } from '@jupyterlab/apputils';

import { dashboardUrl } from './api';

const tabs = new Map<string, MainAreaWidget<IFrame>>();

/**
 * Open (or bring forward) the dashboard tab of cluster `id`.
 *
 * The dashboard needs scripts and same-origin requests to the proxy (Jupyter's cookie
 * authenticates them); the Ray token never reaches the page, the server adds it.
 */
export function openDashboard(app: JupyterFrontEnd, id: string, name?: string): MainAreaWidget<IFrame> {
  let tab = tabs.get(id);
  if (!tab || tab.isDisposed) {
    const frame = new IFrame({
      sandbox: ['allow-scripts', 'allow-same-origin', 'allow-forms', 'allow-popups', 'allow-downloads'],
      referrerPolicy: 'same-origin'
    });
    frame.url = dashboardUrl(id);
    tab = new MainAreaWidget({ content: frame });
    tab.id = `slurm-ray-dashboard-${id}`;
    tab.title.label = `Ray: ${name ?? id}`;
    tab.title.caption = `Ray dashboard of ${name ?? id} (${id})`;
    tab.title.closable = true;
    tab.addClass('jp-SlurmRay-dashboardTab');
    tab.node.dataset.slurmRayCluster = id;
    tabs.set(id, tab);
    tab.disposed.connect(() => tabs.delete(id));
  }
  if (!tab.isAttached) {
    app.shell.add(tab, 'main');
  }
  app.shell.activateById(tab.id);
  return tab;
}

/** The cluster id a link points at, when it is one of our dashboard links (else null). */
export function dashboardLinkTarget(anchor: HTMLAnchorElement, baseUrl: string): string | null {
  const marked = anchor.dataset.slurmRayDashboard;
  if (marked) {
    return marked;
  }
  let path: string;
  try {
    const url = new URL(anchor.href, window.location.href);
    if (url.origin !== window.location.origin) {
      return null;
    }
    path = url.pathname;
  } catch {
    return null;
  }
  const prefix = `${new URL(baseUrl, window.location.href).pathname.replace(/\/?$/, '/')}slurm-ray/dashboard/`;
  if (!path.startsWith(prefix)) {
    return null;
  }
  const id = decodeURIComponent(path.slice(prefix.length).split('/')[0]);
  return id || null;
}
