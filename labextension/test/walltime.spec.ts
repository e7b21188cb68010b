import type { ICluster } from '../src/api';
import {
  bytesText,
  clustersToWarn,
  detailRows,
  hoursText,
  queueText,
  startText,
  usageShort,
  walltimeWarningText
} from '../src/format';

function cluster(fields: Partial<ICluster> = {}): ICluster {
  return {
    id: 'ray-1a2b3c4d',
    name: 'analysis',
    state: 'CONNECTED',
    reason: null,
    phase: null,
    job_id: '123',
    slurm_state: 'RUNNING',
    nodes: ['node1'],
    nodes_wanted: 1,
    nodes_joined: 1,
    gpus_per_node: 0,
    time_limit: 600,
    time_left: 50,
    estimated_start: null,
    owner: 'alice',
    owner_host: 'login1',
    owner_pid: 4242,
    owner_alive: true,
    server_owned: false,
    detached: false,
    target: 'local',
    attach_command: '%slurm_ray attach analysis',
    dashboard_url: '/slurm-ray/dashboard/ray-1a2b3c4d/',
    ...fields
  } as ICluster; // without the fields that have no bearing here
}

const USAGE = {
  available: true,
  final: true,
  cpu_hours: 0.0222,
  gpu_hours: 2,
  cpu_efficiency: 0.341,
  max_rss: 1288490188
};

describe('clustersToWarn', () => {
  it('picks running clusters whose warning is due, once', () => {
    const warned = new Set<string>();
    const due = cluster({ walltime_warning: true });
    expect(clustersToWarn([due, cluster({ id: 'b' })], warned)).toEqual([due]);
    warned.add(due.id);
    expect(clustersToWarn([due], warned)).toEqual([]);
  });
  it('never for ended clusters, unreadable records or older servers', () => {
    const ended = cluster({ walltime_warning: true, state: 'TIMEOUT' });
    const unreadable = cluster({ walltime_warning: true, unreadable: true });
    expect(clustersToWarn([ended, unreadable, cluster()], new Set())).toEqual([]);
  });
});

describe('walltimeWarningText', () => {
  it('names the cluster, its job and the time left', () => {
    expect(walltimeWarningText(cluster(), 72)).toBe(
      'Slurm Ray: the walltime of analysis (job 123) is almost over: 0:01:12 left. Save your work, or extend it.'
    );
  });
});

describe('usage', () => {
  it('reads hours and bytes for humans', () => {
    expect(hoursText(0)).toBe('0');
    expect(hoursText(0.0222)).toBe('0.022');
    expect(hoursText(4)).toBe('4');
    expect(hoursText(12.34)).toBe('12.3');
    expect(bytesText(1288490188)).toBe('1.2 GiB');
    expect(bytesText(512)).toBe('512 B');
    expect(bytesText(null)).toBe('—');
  });
  it('is a compact column in the list', () => {
    expect(usageShort(cluster({ usage: USAGE }))).toBe('0.022 CPU-h · 2 GPU-h · 34 % CPU');
    const running = { ...USAGE, final: false, gpu_hours: 0, cpu_efficiency: null };
    expect(usageShort(cluster({ usage: running }))).toBe('0.022 CPU-h');
    expect(usageShort(cluster({ usage: { ...USAGE, available: false } }))).toBe('no accounting');
    expect(usageShort(cluster())).toBeNull();
  });
});

describe('queueText', () => {
  const queue = {
    reason: 'Resources',
    meaning: 'the nodes it needs are busy',
    action: 'wait',
    never_starts: false,
    hint: 'waiting for 2 nodes in partition gpu',
    estimated_start: '2030-01-02T03:04:05'
  };
  it("explains a pending cluster's reason, what it waits for and when it may start", () => {
    expect(queueText(cluster({ state: 'PENDING', queue }))).toBe(
      'Resources: the nodes it needs are busy · waiting for 2 nodes in partition gpu · est. start 2030-01-02 03:04'
    );
    expect(queueText(cluster({ queue }))).toBeNull(); // not pending any more
    expect(startText(null)).toBeNull();
  });
  it('gives the details rows with what to do', () => {
    const rows = detailRows(cluster({ state: 'PENDING', queue, usage: null }), 600);
    expect(rows).toContainEqual(['What to do', 'wait']);
    expect(rows).toContainEqual(['Estimated start', '2030-01-02 03:04']);
  });
});

describe('detailRows', () => {
  it('shows the walltime and the usage per node', () => {
    const full = {
      ...USAGE,
      max_rss_by_node: { node1: 1288490188 },
      max_rss_node: 'node1'
    };
    const rows = detailRows(cluster({ walltime_warning: true, usage: full, qos: 'short' }), 50);
    expect(rows).toContainEqual(['Walltime left', '0:00:50 of 0:10:00 — almost over']);
    expect(rows).toContainEqual(['Charged to', 'QOS short']);
    expect(rows).toContainEqual([
      'Usage',
      'used 0.022 CPU-hours, 2 GPU-hours, CPU efficiency 34 %, max RSS 1.2 GiB on node1'
    ]); // worded here, from the figures
    expect(rows).toContainEqual(['CPU efficiency', '34 %']);
    expect(rows).toContainEqual(['Max RSS on node1', '1.2 GiB']);
  });
});
