import { dashboardIdOfUrl, dashboardLinkTarget } from '../src/links';

const PAGE = 'http://jupyter.example:8888/user/alice/lab/tree/a.ipynb';
const BASE = '/user/alice/';

describe('dashboardIdOfUrl', () => {
  it('finds the cluster id of a dashboard link under the base URL', () => {
    expect(dashboardIdOfUrl('/user/alice/slurm-ray/dashboard/ray-1a2b/', BASE, PAGE)).toBe(
      'ray-1a2b'
    );
    expect(
      dashboardIdOfUrl(
        'http://jupyter.example:8888/user/alice/slurm-ray/dashboard/ray-1a2b/#/jobs',
        BASE,
        PAGE
      )
    ).toBe('ray-1a2b');
  });
  it('also in the sandboxed (capability) form and relative to the page', () => {
    expect(
      dashboardIdOfUrl('/user/alice/slurm-ray/dashboard/ray-1a2b/~c4p4b1l1ty/', BASE, PAGE)
    ).toBe('ray-1a2b');
    expect(dashboardIdOfUrl('../../slurm-ray/dashboard/ray-1a2b/', BASE, PAGE)).toBe('ray-1a2b');
  });
  it('accepts a base URL without its trailing slash', () => {
    expect(dashboardIdOfUrl('/user/alice/slurm-ray/dashboard/r-1/', '/user/alice', PAGE)).toBe(
      'r-1'
    );
  });
  it('is null for other origins, other base URLs and other paths', () => {
    expect(
      dashboardIdOfUrl('http://evil.example/user/alice/slurm-ray/dashboard/r-1/', BASE, PAGE)
    ).toBeNull();
    expect(dashboardIdOfUrl('/user/bob/slurm-ray/dashboard/r-1/', BASE, PAGE)).toBeNull();
    expect(dashboardIdOfUrl('/user/alice/lab/tree/x.ipynb', BASE, PAGE)).toBeNull();
    expect(dashboardIdOfUrl('/user/alice/slurm-ray/dashboard/', BASE, PAGE)).toBeNull();
  });
  it('is null, not an exception, for malformed URLs and escapes', () => {
    expect(dashboardIdOfUrl('http://[', BASE, PAGE)).toBeNull();
    expect(dashboardIdOfUrl('/user/alice/slurm-ray/dashboard/%E0%A4%A/', BASE, PAGE)).toBeNull();
    expect(dashboardIdOfUrl('/x', BASE, 'not a url')).toBeNull();
  });
});

describe('dashboardLinkTarget', () => {
  it('prefers the data-slurm-ray-dashboard mark', () => {
    const marked = { href: 'http://elsewhere.example/', dataset: { slurmRayDashboard: 'r-9' } };
    expect(dashboardLinkTarget(marked, BASE, PAGE)).toBe('r-9');
  });
  it('else reads the href', () => {
    const plain = { href: '/user/alice/slurm-ray/dashboard/r-2/', dataset: {} };
    expect(dashboardLinkTarget(plain, BASE, PAGE)).toBe('r-2');
    expect(dashboardLinkTarget({ href: '/user/alice/tree', dataset: {} }, BASE, PAGE)).toBeNull();
  });
});
