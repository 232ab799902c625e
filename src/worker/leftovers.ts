import { lstatSync, rmSync } from "node:fs";
import { namesOfDeadOwners } from "../core/dead-owners.ts";
import { dirname, join } from "node:path";
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
export async function endLeftovers(layout: HomeLayout, graceMs: number, keepWorkdirs = false): Promise<{ jobs: number; processes: number }> {
  const store = new JobStore(layout);
  const work = layout.clusterWork;
  const bundles = layout.clusterBundles;
  let jobs = 0;
  let processes = 0;
  try {
    for (const job of store.list(10_000)) {
      if (job.state !== "queued" && job.state !== "preparing" && job.state !== "running") continue;
      if (job.runnerPid !== null && mayBeRunning({ pid: job.runnerPid, start: job.runnerStart, boot: job.pidBoot })) continue;
      const found = jobProcesses(job.id).length;
      if (found) processes += await endJobProcesses(job.id, graceMs);
      store.update(job.id, { state: "failed", exitCode: ExitCode.failed, error: "its worker was killed; what was left of it was ended when the worker started again", childPid: null, childStart: null });
      // Its workdir, unpacked for that attempt only, is removed as a finished task's is (keep_workdirs keeps it).
      if (!keepWorkdirs && dirname(job.spec.workdir) === work && !isLink(work)) rmSync(job.spec.workdir, { recursive: true, force: true });
      jobs++;
    }
  } finally {
    store.close();
  }
  if (!isLink(bundles)) sweepDeadTemps(bundles);
  return { jobs, processes };
}

/** Nothing is deleted through a folder of the home that is a link: its target is not the home's. */
function isLink(path: string): boolean {
  try {
    return lstatSync(path).isSymbolicLink();
  } catch {
    return false;
  }
}

/** A download or unpack a killed worker left half-done (`NAME.PID.UUID.tmp`): removed once its process is gone. */
function sweepDeadTemps(dir: string): void {
  for (const name of namesOfDeadOwners(dir, /\.(\d+)\.[0-9a-f-]{36}\.tmp$/)) rmSync(join(dir, name), { recursive: true, force: true });
}
