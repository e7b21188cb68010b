/**
 * The doctor's checklist (`GET slurm-ray/api/doctor`) rendered for a dialog: pure functions,
 * no JupyterLab, so that they are unit-tested alone.
 */

/** One check: ok, fail, warn (works, see the fix) or skip (not applicable / not checked). */
export interface IDoctorCheck {
  name: string;
  title: string;
  status: 'ok' | 'fail' | 'warn' | 'skip';
  detail: string;
  fix: string;
  symbol: string;
}

/** The doctor's report, as `Report.to_dict()` answers it. */
export interface IDoctorReport {
  ok: boolean;
  target: string;
  test_job: {
    job_id: string | null;
    node: string | null;
    queue_wait: number | null;
    duration: number | null;
    import_ray_seconds: number | null;
  };
  checks: IDoctorCheck[];
}

const ESCAPES: Record<string, string> = {
  '&': '&amp;',
  '<': '&lt;',
  '>': '&gt;',
  '"': '&quot;',
  "'": '&#39;'
};

/** Text made safe to place in HTML. */
export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, c => ESCAPES[c]);
}

/** `All 8 checks passed` or `2 of 9 checks failed`, with the test job's queue wait. */
export function doctorSummary(report: IDoctorReport): string {
  const failed = report.checks.filter(c => c.status === 'fail').length;
  const counted = report.checks.filter(c => c.status !== 'skip').length;
  const verdict = failed ? `${failed} of ${counted} checks failed` : `All ${counted} checks passed`;
  const job = report.test_job;
  if (!job.job_id) {
    return `${verdict}; no test job ran.`;
  }
  const where = job.node ? ` on ${job.node}` : '';
  const wait = job.queue_wait !== null ? `, ${job.queue_wait} s in the queue` : '';
  return `${verdict}; test job ${job.job_id}${where}${wait}.`;
}

/** The checklist as an HTML table (every text escaped); the fix shown for ✗ and warnings. */
export function doctorTableHtml(report: IDoctorReport): string {
  const rows = report.checks.map(check => {
    const fix = check.status === 'fail' || check.status === 'warn' ? escapeHtml(check.fix) : '';
    return (
      `<tr class="jsr-doctor-${check.status}">` +
      `<td class="jsr-doctor-symbol">${escapeHtml(check.symbol)}</td>` +
      `<td>${escapeHtml(check.title)}</td><td>${escapeHtml(check.detail)}</td>` +
      `<td>${fix}</td></tr>`
    );
  });
  return (
    `<p class="jsr-doctor-summary">${escapeHtml(doctorSummary(report))}</p>` +
    '<table class="jsr-doctor"><thead><tr><th></th><th>Check</th><th>What was seen</th>' +
    `<th>Fix</th></tr></thead><tbody>${rows.join('')}</tbody></table>`
  );
}
