import {
  goneText,
  isGone,
  isRestoring,
  MAX_WARNED,
  notRestoredText,
  restoreArgs,
  sidebarState,
  tabId,
  tabNamespace,
  warnedIn
} from '../src/restore';

describe('what a reload keeps of a cluster tab', () => {
  it('keeps the cluster and its name, never a URL', () => {
    expect(restoreArgs('ray-1a2b3c4d', 'analysis')).toEqual({
      id: 'ray-1a2b3c4d',
      name: 'analysis',
      restored: true
    });
    expect(restoreArgs('ray-1a2b3c4d')).toEqual({ id: 'ray-1a2b3c4d', restored: true });
  });

  it('names one tracker per kind and one tab per cluster', () => {
    expect(tabNamespace('dashboard')).toBe('slurm-ray-dashboard');
    expect(tabId('dashboard', 'ray-1a2b3c4d')).toBe('slurm-ray-dashboard-ray-1a2b3c4d');
    expect(tabId('logs', 'ray-1a2b3c4d')).toBe('slurm-ray-logs-ray-1a2b3c4d');
    expect(tabId('details', 'ray-1a2b3c4d')).not.toBe(tabId('logs', 'ray-1a2b3c4d'));
  });

  it('tells a restored command from a click', () => {
    expect(isRestoring(restoreArgs('ray-1a2b3c4d'))).toBe(true);
    expect(isRestoring({ id: 'ray-1a2b3c4d' })).toBe(false);
    expect(isRestoring({ id: 'ray-1a2b3c4d', restored: 'true' })).toBe(false);
  });
});

describe('a restored tab whose cluster is gone', () => {
  it('is gone only on a 404', () => {
    expect(isGone({ status: 404, message: "no Ray cluster 'ray-1a2b3c4d'" })).toBe(true);
    expect(isGone({ status: 502 })).toBe(false);
    expect(isGone(new Error('network'))).toBe(false);
    expect(isGone(null)).toBe(false);
  });

  it('says which tab closed and why', () => {
    const gone = notRestoredText('dashboard', 'analysis', { status: 404 });
    expect(gone).toBe(
      'Slurm Ray: the Ray dashboard tab of analysis was closed after the reload: ' +
        'the cluster is no longer in the registry (forgotten).'
    );
    expect(goneText('logs', 'analysis')).toContain('the Logs tab of analysis was closed');
    const failed = notRestoredText('logs', 'ray-1a2b3c4d', new Error('Slurm did not answer'));
    expect(failed).toContain('the Logs tab of ray-1a2b3c4d');
    expect(failed).toContain('the server said: Slurm did not answer');
  });
});

describe("the sidebar's remembered walltime warnings", () => {
  it('round-trips through the saved state', () => {
    const saved = JSON.parse(JSON.stringify(sidebarState(new Set(['ray-a', 'ray-b']))));
    expect(warnedIn(saved)).toEqual(['ray-a', 'ray-b']);
  });

  it('keeps the newest when there are too many', () => {
    const ids = Array.from({ length: MAX_WARNED + 5 }, (_, i) => `ray-${i}`);
    const kept = sidebarState(ids).warned;
    expect(kept).toHaveLength(MAX_WARNED);
    expect(kept[0]).toBe('ray-5');
    expect(kept[kept.length - 1]).toBe(`ray-${MAX_WARNED + 4}`);
  });

  it('reads nothing from a state that is not its own', () => {
    expect(warnedIn(undefined)).toEqual([]);
    expect(warnedIn({ warned: 'ray-a' })).toEqual([]);
    expect(warnedIn({ warned: ['ray-a', 3, null] })).toEqual(['ray-a']);
  });
});
