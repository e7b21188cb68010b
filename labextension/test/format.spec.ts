import type { ICluster, IUsage } from '../src/api';
import {
  canForget,
  connectionText,
  hasEnded,
  hms,
  liveThenEnded,
  nodesLostText,
  ownerText,
  shortDuration,
  stateKind,
  timeLeftNow,
  recentTitle,
  unreachableText,
  unreadableText,
  usageSummary
} from '../src/format';

/** A cluster as an older server lists it: none of the newer fields. */
function cluster(fields: Partial<ICluster> = {}): ICluster {
  return {
    id: 'ray-1a2b3c4d',
    name: 'analysis',
    state: 'READY',
    reason: null,
    phase: null,
    job_id: '123',
    slurm_state: 'RUNNING',
    nodes: ['node1'],
    nodes_wanted: 2,
    nodes_joined: 1,
    gpus_per_node: 0,
    time_limit: 3600,
    time_left: 600,
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

describe('hms', () => {
  it('reads hours, minutes and seconds', () => {
    expect(hms(3723)).toBe('1:02:03');
    expect(hms(59.9)).toBe('0:00:59');
  });
  it('is a dash when unknown or negative', () => {
    expect(hms(null)).toBe('—');
    expect(hms(undefined)).toBe('—');
    expect(hms(-1)).toBe('—');
  });
});

describe('shortDuration', () => {
  it('is minutes:seconds below an hour, hms above', () => {
    expect(shortDuration(45)).toBe('0:45');
    expect(shortDuration(723)).toBe('12:03');
    expect(shortDuration(3723)).toBe('1:02:03');
  });
  it('never goes below zero (clocks differ)', () => {
    expect(shortDuration(-5)).toBe('0:00');
  });
});

describe('timeLeftNow', () => {
  it('counts down from what Slurm said', () => {
    expect(timeLeftNow(cluster({ time_left: 600 }), 1000, 1060)).toBe(540);
  });
  it('stops at zero, and is null when Slurm gave no limit', () => {
    expect(timeLeftNow(cluster({ time_left: 10 }), 1000, 2000)).toBe(0);
    expect(timeLeftNow(cluster({ time_left: null }), 1000, 1001)).toBeNull();
  });
});

describe('unreachableText', () => {
  it('ticks from the moment Slurm stopped answering', () => {
    const silent = cluster({ slurm_unreachable_since: 1000 });
    expect(unreachableText(silent, 1045)).toBe('Slurm not answering for 0:45');
    expect(unreachableText(silent, 1000 + 3723)).toBe('Slurm not answering for 1:02:03');
  });
  it('is null while Slurm answers, also for servers without the field', () => {
    expect(unreachableText(cluster({ slurm_unreachable_since: null }), 1000)).toBeNull();
    expect(unreachableText(cluster(), 1000)).toBeNull();
  });
});

describe('nodesLostText', () => {
  it('names the lost nodes', () => {
    expect(nodesLostText(cluster({ nodes_lost: ['node2'] }))).toBe('node2 lost');
    expect(nodesLostText(cluster({ nodes_lost: ['node2', 'node3'] }))).toBe('node2, node3 lost');
  });
  it('is null when none was lost, or the field is missing or not a list', () => {
    expect(nodesLostText(cluster({ nodes_lost: [] }))).toBeNull();
    expect(nodesLostText(cluster())).toBeNull();
    expect(nodesLostText(cluster({ nodes_lost: 'node2' as unknown as string[] }))).toBeNull();
  });
});

describe('hasEnded and canForget', () => {
  it('take the server at its word, and fall back on the state', () => {
    expect(hasEnded(cluster({ final: true, state: 'READY' }))).toBe(true);
    expect(hasEnded(cluster({ state: 'CANCELLED' }))).toBe(true);
    expect(hasEnded(cluster({ state: 'PENDING' }))).toBe(false);
  });
  it('offer Forget only where the server allows it, and for unreadable records', () => {
    expect(canForget(cluster({ forgettable: true, state: 'CANCELLED' }))).toBe(true);
    expect(canForget(cluster({ unreadable: true }))).toBe(true);
    expect(canForget(cluster({ state: 'CANCELLED' }))).toBe(false); // an older server
    expect(canForget(cluster({ forgettable: false, state: 'READY' }))).toBe(false);
  });
});

describe('unreadableText', () => {
  it('names the record and why', () => {
    const bad = cluster({ id: 'broken-0001', unreadable: true, error: 'not valid JSON' });
    expect(unreadableText(bad)).toBe('unreadable record broken-0001: not valid JSON');
    expect(unreadableText(cluster({ id: 'x-0001', error: null }))).toBe(
      'unreadable record x-0001: no reason given'
    );
  });
});

describe('stateKind', () => {
  it('groups states for the badge', () => {
    expect(stateKind('CONNECTED')).toBe('up');
    expect(stateKind('PENDING')).toBe('busy');
    expect(stateKind('CANCELLED')).toBe('ended');
    expect(stateKind('NODE_FAIL')).toBe('failed');
  });
});

describe('ownerText', () => {
  it('says who owns the cluster and whether the owner runs', () => {
    expect(ownerText(cluster({ server_owned: true }))).toBe('alice (this server)');
    expect(ownerText(cluster({ owner_alive: false }))).toBe('alice (owner gone)');
    expect(ownerText(cluster())).toBe('alice (pid 4242 on login1)');
  });
});

describe('connectionText', () => {
  it('says how the owner kernel is connected while CONNECTED', () => {
    const driver = { state: 'CONNECTED', connect_mode: 'driver' as const };
    expect(connectionText(cluster(driver))).toBe('Ray driver');
    const client = { state: 'CONNECTED', connect_mode: 'client' as const };
    expect(connectionText(cluster(client))).toBe('Ray Client');
  });
  it('is null otherwise, also for servers without the field', () => {
    expect(connectionText(cluster({ connect_mode: 'driver' }))).toBeNull();
    expect(connectionText(cluster({ state: 'CONNECTED' }))).toBeNull();
  });
});

describe('liveThenEnded', () => {
  it('puts live clusters and unreadable records first, newest first, then the ended ones', () => {
    const listing = [
      cluster({ id: 'a', state: 'STOPPED', final: true }),
      cluster({ id: 'b', state: 'CONNECTED' }),
      cluster({ id: 'c', state: 'FAILED' }),
      cluster({ id: 'd', unreadable: true, state: 'UNREADABLE', final: true }),
      cluster({ id: 'e', state: 'PENDING' })
    ];
    const { live, ended } = liveThenEnded(listing);
    expect(live.map(c => c.id)).toEqual(['e', 'd', 'b']);
    expect(ended.map(c => c.id)).toEqual(['c', 'a']);
    expect(recentTitle(ended.length)).toBe('Recent: 2 ended');
  });

  it('has nothing to fold when every cluster is live', () => {
    const { live, ended } = liveThenEnded([cluster({ id: 'x' })]);
    expect(live).toHaveLength(1);
    expect(ended).toHaveLength(0);
  });
});

describe('usageSummary: the details words its figures as the notebook does', () => {
  const figures: IUsage = {
    available: true,
    final: true,
    cpu_hours: 0.1,
    gpu_hours: 0,
    cpu_efficiency: 0.34,
    max_rss: 1288490188.8,
    max_rss_node: 'node1'
  };

  it('says what was used, how well, and where memory peaked', () => {
    expect(usageSummary(figures)).toBe(
      'used 0.1 CPU-hours, 0 GPU-hours, CPU efficiency 34 %, max RSS 1.2 GiB on node1'
    );
  });

  it('says what is still to come while the jobs run', () => {
    const running = { ...figures, final: false, cpu_efficiency: null, max_rss: null, elapsed: 64 };
    expect(usageSummary(running)).toBe(
      'used 0.1 CPU-hours, 0 GPU-hours, in 0:01:04 so far (efficiency and memory when it ends)'
    );
  });

  it('names what Slurm did not record once they ended', () => {
    expect(usageSummary({ ...figures, max_rss: null })).toBe(
      'used 0.1 CPU-hours, 0 GPU-hours, CPU efficiency 34 %, max RSS not recorded by Slurm'
    );
  });

  it('says why there is none', () => {
    const none = {
      ...figures,
      available: false,
      unavailable: 'local mode has no Slurm accounting'
    };
    expect(usageSummary(none)).toBe('usage unavailable: local mode has no Slurm accounting');
  });
});
