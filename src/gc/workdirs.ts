import { readdirSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { markedJobCounts } from "../core/job-processes.ts";
import { mayBeRunning } from "../core/process-identity.ts";
import { JobStore } from "../jobs/store.ts";

/**
 * Remote jobs' workdirs (cluster/work/<job>-<attempt>, worker/tasks.ts) that
 * a killed worker left: the task removes its own when it ends, and a worker
 * starting again on the home removes a dead run's (worker/leftovers.ts); a
 * worker that never comes back leaves them to gc. One counts as left only
 * when its job's record says it never ended, the worker that ran it is
 * provably gone (pid, start time, boot) and no process carries its mark: a
 * live worker's job, one that kept its workdir (worker.keep_workdirs, a
 * finished job) and one not yet recorded (a bundle being unpacked) are
 * never touched.
 */
export function leftWorkdirs(layout: HomeLayout): string[] {
  const work = layout.clusterWork;
  let names: string[];
  try {
    names = readdirSync(work);
  } catch {
    return [];
  }
  if (!names.length) return [];
  const store = new JobStore(layout, { readOnly: true });
  try {
    const marked = markedJobCounts();
    const left = new Set<string>();
    for (const job of store.list(10_000)) {
      if (job.state !== "queued" && job.state !== "preparing" && job.state !== "running") continue;
      if (job.runnerPid === null || mayBeRunning({ pid: job.runnerPid, start: job.runnerStart, boot: job.pidBoot })) continue;
      if (marked.get(job.id)) continue;
      left.add(job.spec.workdir);
    }
    return names.map((n) => join(work, n)).filter((path) => left.has(path));
  } finally {
    store.close();
  }
}
