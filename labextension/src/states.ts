/**
 * The cluster states in their groups, as the server's `jupyter_slurm_ray/states.py` declares
 * them (`UP`, `FINAL`; `BUSY` the others). A fast test (tests/fast/test_view_contract.py)
 * fails when the two differ: change both together.
 */
export const UP = new Set(['READY', 'CONNECTED', 'DEGRADED']);
export const BUSY = new Set(['SUBMITTING', 'PENDING', 'STARTING', 'STOPPING']);
export const FINAL = new Set([
  'STOPPED',
  'FAILED',
  'TIMEOUT',
  'CANCELLED',
  'PREEMPTED',
  'NODE_FAIL',
  'OUT_OF_MEMORY'
]);
