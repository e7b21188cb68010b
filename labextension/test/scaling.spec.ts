import type { ICluster, IWorkerJob } from '../src/api';
import { lastScalingDecision, scalingText } from '../src/format';

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
    detached: false,
    target: 'local',
    attach_command: '%slurm_ray attach analysis',
    dashboard_url: '',
    ...fields
  } as ICluster;
}

const job = (fields: Partial<IWorkerJob>): IWorkerJob => ({
  job_id: '13',
  state: 'RUNNING',
  reason: null,
  host: 'node2',
  joined: true,
  ...fields
});

describe('scalingText', () => {
  it('says nothing for a cluster without worker jobs (or from an older server)', () => {
    expect(scalingText(cluster())).toBeNull();
    expect(scalingText(cluster({ worker_jobs: [] }))).toBeNull();
  });

  it('shows nodes alive of wanted, and the pending worker jobs with Slurm’s reasons', () => {
    const text = scalingText(
      cluster({
        nodes_joined: 2,
        nodes_wanted: 4,
        worker_jobs: [
          job({}),
          job({ job_id: '14', state: 'PENDING', reason: 'Resources', host: null, joined: false }),
          job({ job_id: '15', state: 'PENDING', reason: 'Priority', host: null, joined: false })
        ]
      })
    );
    expect(text).toBe('2/4 nodes alive · worker jobs: 1 running, 2 pending (Priority, Resources)');
  });

  it('says nothing once the cluster ended', () => {
    expect(scalingText(cluster({ final: true, worker_jobs: [job({})] }))).toBeNull();
  });
});

describe('scalingText by worker group', () => {
  it('counts each group, the default first, with Slurm’s reasons and estimated start', () => {
    const text = scalingText(
      cluster({
        nodes_joined: 2,
        nodes_wanted: 4,
        worker_jobs: [
          job({ group: 'gpu' }),
          job({ job_id: '14' }),
          job({
            job_id: '15',
            group: 'gpu',
            state: 'PENDING',
            reason: 'Resources',
            host: null,
            joined: false,
            estimated_start: '2026-12-01 14:05'
          })
        ]
      })
    );
    expect(text).toBe(
      '2/4 nodes alive · worker jobs: default: 1 running; ' +
        'gpu: 1 running, 1 pending (Resources, est. start 2026-12-01 14:05)'
    );
  });
});

describe('lastScalingDecision', () => {
  it('is the newest line of the decisions, nothing once the cluster ended', () => {
    const scaling = ['10:00:01 1 → 3 nodes (submitted 14, 15): scale() by its owner', '10:05:00 x'];
    expect(lastScalingDecision(cluster({ scaling }))).toBe('10:05:00 x');
    expect(lastScalingDecision(cluster({ scaling, final: true }))).toBeNull();
    expect(lastScalingDecision(cluster())).toBeNull();
  });
});
