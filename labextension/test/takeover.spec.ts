import type { ICluster } from '../src/api';
import { canTakeOver, ownerName, ownerText } from '../src/format';
import { ITakeoverSteps, takeOver, takeoverWarning } from '../src/takeover';

function cluster(fields: Partial<ICluster> = {}): ICluster {
  return {
    id: 'ray-1a2b3c4d',
    name: 'analysis',
    state: 'READY',
    reason: null,
    phase: null,
    job_id: '12',
    slurm_state: 'RUNNING',
    nodes: ['node1'],
    nodes_wanted: 1,
    nodes_joined: 1,
    gpus_per_node: 0,
    time_limit: 600,
    time_left: 500,
    estimated_start: null,
    owner: 'alice',
    owner_host: 'login1',
    owner_pid: 42,
    owner_alive: true,
    server_owned: false,
    can_take_over: true,
    detached: false,
    target: 'local',
    attach_command: '%slurm_ray attach analysis',
    dashboard_url: '',
    ...fields
  } as ICluster;
}

/** The steps, recording what the command did; the user answers `answer`. */
function steps(answer: boolean, takeover: ITakeoverSteps['takeover']) {
  const done: string[] = [];
  const recorded: ITakeoverSteps = {
    confirm: async (title, body, action) => {
      done.push(`confirm ${title} [${action}] ${body}`);
      return answer;
    },
    takeover: async id => {
      done.push(`takeover ${id}`);
      return takeover(id);
    },
    success: message => void done.push(`success ${message}`),
    failure: async (title, message) => void done.push(`failure ${title}: ${message}`),
    refresh: async () => void done.push('refresh')
  };
  return { done, recorded };
}

describe('canTakeOver', () => {
  it('offers Take over for an active cluster another process owns', () => {
    expect(canTakeOver(cluster())).toBe(true);
  });
  it('offers nothing for one this server owns, an ended one, or from an older server', () => {
    expect(canTakeOver(cluster({ server_owned: true }))).toBe(false);
    expect(canTakeOver(cluster({ state: 'STOPPED', final: true }))).toBe(false);
    expect(canTakeOver(cluster({ can_take_over: undefined }))).toBe(false);
  });
});

describe('ownerText and ownerName', () => {
  it('name the owner and count the observers', () => {
    const watched = cluster({ observers: [{ pid: 7, host: 'login1' }] });
    expect(ownerText(watched)).toBe('alice (pid 42 on login1) · 1 observing');
    expect(ownerName(watched)).toBe('pid 42 on login1');
    expect(ownerName(cluster({ server_owned: true }))).toBe('this server');
  });
});

describe('takeOver', () => {
  const label = 'analysis (ray-1a2b3c4d)';

  it('asks first, naming the current owner, and does nothing when declined', async () => {
    const { done, recorded } = steps(false, async () => cluster());
    expect(await takeOver('ray-1a2b3c4d', label, cluster(), recorded)).toBe(false);
    expect(done).toHaveLength(1);
    expect(done[0]).toContain('Take over the cluster? [Take over]');
    expect(done[0]).toContain(`${label} is owned by pid 42 on login1`);
    expect(done[0]).toContain('stops renewing its lease, scaling it and cancelling it at exit');
  });

  it('takes over once confirmed and says who owns it now and who did before', async () => {
    const owned = cluster({ server_owned: true, owner_pid: 9, can_take_over: false });
    const { done, recorded } = steps(true, async () => owned);
    expect(await takeOver('ray-1a2b3c4d', label, cluster(), recorded)).toBe(true);
    expect(done.slice(1)).toEqual([
      'takeover ray-1a2b3c4d',
      `success ${label} is owned by this server now (was pid 42 on login1).`,
      'refresh'
    ]);
  });

  it('says so when the cluster ended meanwhile (409), and refreshes', async () => {
    const ended = Object.assign(new Error('ray-1a2b3c4d is STOPPED'), { status: 409 });
    const { done, recorded } = steps(true, async () => {
      throw ended;
    });
    expect(await takeOver('ray-1a2b3c4d', label, undefined, recorded)).toBe(false);
    expect(done[0]).toContain(`${label} is owned by another process`);
    expect(done.slice(2)).toEqual([
      `failure ${label} is no longer active: ray-1a2b3c4d is STOPPED`,
      'refresh'
    ]);
  });

  it('warns in words a user can act on', () => {
    expect(takeoverWarning(label)).toContain('This Jupyter server becomes its owner');
  });
});
