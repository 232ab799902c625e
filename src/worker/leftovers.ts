import type { HomeLayout } from "../config/paths.ts";
import { endJobProcesses, jobProcesses } from "../core/job-processes.ts";
import { mayBeRunning } from "../core/process-identity.ts";
import { ExitCode } from "../errors.ts";
import { JobStore } from "../jobs/store.ts";

/**
 * What a killed worker left running. Its jobs' main processes died with it
 * (their parent-death signal), but what they started may not have (a setsid
 * child, a daemon). A worker starting on the same home ends those first,
 * before it registers: the server gives their jobs out again only once this
 * worker has come back, so no job runs twice at once. Only jobs whose runner
 * (the dead worker's process) is provably gone are touched: a second worker
 * still running on this home keeps its jobs.
 */
export async function endLeftovers(layout: HomeLayout, graceMs: number): Promise<{ jobs: number; processes: number }> {
  const store = new JobStore(layout);
  let jobs = 0;
  let processes = 0;
  try {
    for (const job of store.list(10_000)) {
      if (job.state !== "queued" && job.state !== "preparing" && job.state !== "running") continue;
      if (job.runnerPid !== null && mayBeRunning({ pid: job.runnerPid, start: job.runnerStart, boot: job.pidBoot })) continue;
      const found = jobProcesses(job.id).length;
      if (found) processes += await endJobProcesses(job.id, graceMs);
      store.update(job.id, { state: "failed", exitCode: ExitCode.failed, error: "its worker was killed; what was left of it was ended when the worker started again", childPid: null, childStart: null });
      jobs++;
    }
  } finally {
    store.close();
  }
  return { jobs, processes };
}
