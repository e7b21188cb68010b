import type { IDoctorCheck, IDoctorReport } from '../src/doctor';
import { doctorSummary, doctorTableHtml, escapeHtml } from '../src/doctor';

function check(name: string, status: IDoctorCheck['status'], fields: Partial<IDoctorCheck> = {}) {
  const symbols = { ok: '✓', fail: '✗', warn: '!', skip: '–' };
  return {
    name,
    title: `title of ${name}`,
    status,
    detail: `detail of ${name}`,
    fix: `fix of ${name}`,
    symbol: symbols[status],
    ...fields
  };
}

function report(checks: IDoctorCheck[], jobId: string | null = '42'): IDoctorReport {
  return {
    ok: checks.every(c => c.status !== 'fail'),
    target: 'local',
    test_job: {
      job_id: jobId,
      node: 'node1',
      queue_wait: 0.6,
      duration: 3.1,
      import_ray_seconds: 1.2
    },
    checks
  };
}

describe('the doctor dialog', () => {
  it('says how many checks passed and how long the test job waited', () => {
    const healthy = report([check('ssh', 'skip'), check('slurm', 'ok'), check('ray', 'ok')]);
    expect(doctorSummary(healthy)).toBe(
      'All 2 checks passed; test job 42 on node1, 0.6 s in the queue.'
    );
  });

  it('counts the failures and says when no test job ran', () => {
    const broken = report([check('slurm', 'fail'), check('python', 'skip')], null);
    expect(doctorSummary(broken)).toBe('1 of 1 checks failed; no test job ran.');
  });

  it('shows one row per check, the fix only for failures and warnings', () => {
    const html = doctorTableHtml(
      report([check('slurm', 'ok'), check('ray', 'fail'), check('address', 'warn')])
    );
    expect(html.match(/<tr class="jsr-doctor-/g)).toHaveLength(3);
    expect(html).toContain('<tr class="jsr-doctor-fail"><td class="jsr-doctor-symbol">✗</td>');
    expect(html).toContain('fix of ray');
    expect(html).toContain('fix of address');
    expect(html).not.toContain('fix of slurm');
  });

  it('escapes every text from the server', () => {
    const html = doctorTableHtml(
      report([check('python', 'fail', { detail: '<img src=x onerror=alert(1)>', fix: 'a & "b"' })])
    );
    expect(html).not.toContain('<img');
    expect(html).toContain('&lt;img src=x onerror=alert(1)&gt;');
    expect(html).toContain('a &amp; &quot;b&quot;');
    expect(escapeHtml("it's")).toBe('it&#39;s');
  });
});
