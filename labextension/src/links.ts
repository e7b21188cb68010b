/**
 * Which cluster's dashboard a link points at. Pure functions of URLs: no JupyterLab here.
 *
 * Dashboard links rendered by the kernel side are `<base_url>slurm-ray/dashboard/<id>/…`
 * (also the sandboxed `…/<id>/~<capability>/…` form), optionally marked with
 * `data-slurm-ray-dashboard="<id>"`.
 */

/** The dashboard proxy's path under Jupyter's base URL. */
export const DASHBOARD_PATH = 'slurm-ray/dashboard/';

/** The cluster id `href` points at when it is one of our dashboard URLs, else null. */
export function dashboardIdOfUrl(href: string, baseUrl: string, pageUrl: string): string | null {
  let url: URL;
  let page: URL;
  try {
    page = new URL(pageUrl);
    url = new URL(href, page);
  } catch {
    return null;
  }
  if (url.origin !== page.origin) {
    return null;
  }
  const base = new URL(baseUrl, page).pathname.replace(/\/?$/, '/');
  const prefix = `${base}${DASHBOARD_PATH}`;
  if (!url.pathname.startsWith(prefix)) {
    return null;
  }
  try {
    return decodeURIComponent(url.pathname.slice(prefix.length).split('/')[0]) || null;
  } catch {
    return null; // a malformed %-escape
  }
}

/** What of an anchor element matters here. */
export interface ILinkLike {
  href: string;
  dataset: { slurmRayDashboard?: string };
}

/** The cluster id a link points at, when it is one of our dashboard links (else null). */
export function dashboardLinkTarget(
  anchor: ILinkLike,
  baseUrl: string,
  pageUrl: string = window.location.href
): string | null {
  return anchor.dataset.slurmRayDashboard || dashboardIdOfUrl(anchor.href, baseUrl, pageUrl);
}
