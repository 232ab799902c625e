import { formatAgo, formatSeconds, type Output, table } from "../../ui/output.ts";
import type { RemoteTarget } from "../../cluster/client.ts";
import { cancelJob, followToEnd, jobLog, jobStatus, jobStatusOnceBack, listJobs } from "../../cluster/jobs-client.ts";
import { statusLines } from "../job/_lines.ts";
import { writeOut } from "../../ui/terminal.ts";
import { UsageError } from "../../errors.ts";
import { prefixedLines } from "../_tasks-ui.ts";

/**
 * `job status/list/logs/cancel` against a server, printed: what the library
 * (src/cluster/jobs-client.ts) returns. Same JSON shapes as the local ones
 * (src/jobs/status.ts), plus where each job ran.
 */

export async function remoteStatus(target: RemoteTarget, id: string, out: Output): Promise<void> {
  const status = await jobStatus(target, id);
  out.result(status, () => statusLines(status));
}

export async function remoteList(target: RemoteTarget, limit: number, out: Output): Promise<void> {
  const statuses = await listJobs(target, limit);
  out.result(statuses, () => {
    if (!statuses.length) return `no jobs on ${target.url} yet`;
    const rows = [["ID", "NAME", "STATE", "EXIT", "WORKER", "PREPARE", "RUN", "CREATED"]];
    for (const s of statuses) {
      const prep = s.phases.find((p) => p.name === "task.prepare");
      const run = s.phases.find((p) => p.name === "task.run");
      rows.push([s.id, s.name, s.state, s.exit_code === null ? "-" : String(s.exit_code), s.worker ?? "-", prep?.seconds != null ? `${formatSeconds(prep.seconds)}${prep.cache ? ` ${prep.cache}` : ""}` : "-", run?.seconds != null ? formatSeconds(run.seconds) : "-", formatAgo(Date.parse(s.created))]);
    }
    return table(rows);
  });
}

/** Print a job's output; following, until it ends. Returns the exit code `job logs --follow` passes on (the job's, as `job run`'s). */
/** A followed job's end, as `job logs --follow` says it when it did not succeed. */
export interface FollowedEnd {
  id: string;
  state: string;
  exitCode: number | null;
  error: string | null;
}

/** Prints the log; following, resolves to how the job (or task) ended, else null. */
export async function remoteLogs(target: RemoteTarget, id: string, follow: boolean, onTrouble?: (message: string | null) => void, task?: string): Promise<FollowedEnd | null> {
  const status = follow ? await jobStatusOnceBack(target, id, onTrouble) : await jobStatus(target, id);
  const tasks = status.tasks ?? [];
  if (task !== undefined) {
    const t = tasks.find((x) => x.name === task);
    if (!t) throw new UsageError(tasks.length ? `job ${status.id} has no task ${task} (tasks: ${tasks.map((x) => x.name).join(", ")})` : `--task: job ${status.id} is not a job of tasks`);
    id = t.id;
  } else if (tasks.length) {
    const read = async (t: (typeof tasks)[number]) => {
      const lines = prefixedLines(`[${t.name}] `, (text) => writeOut(text));
      if (follow) await followToEnd(target, t.id, (u) => (u.kind === "output" ? lines.push(u.data) : undefined), onTrouble);
      else lines.push(await jobLog(target, t.id));
      lines.flush();
    };
    if (follow) await Promise.all(tasks.map(read));
    else for (const t of tasks) await read(t);
    // The job's own end (its tasks' outcome), once every task's output is here.
    return follow ? ended(status.id, await followToEnd(target, status.id, () => {}, onTrouble)) : null;
  } else id = status.id;
  if (!follow) {
    writeOut(await jobLog(target, id));
    return null;
  }
  return ended(id, await followToEnd(target, id, (u) => (u.kind === "output" ? writeOut(u.data) : undefined), onTrouble));
}

const ended = (id: string, w: { state: string; exit_code: number | null; error: string | null }): FollowedEnd => ({ id, state: w.state, exitCode: w.exit_code, error: w.error });

export async function remoteCancel(target: RemoteTarget, id: string, out: Output): Promise<void> {
  // A worker that does not answer (killed, cut off) ends the job only when its lease runs out: said, not waited on silently.
  const job = await cancelJob(target, id, {
    onWaiting: (worker, waitsMs) => out.progress(`waiting for ${worker ? `worker ${worker}` : "its workers"} to stop it (up to ${Math.round(waitsMs / 1000)} s here; one that does not answer gives it up when its lease runs out)`),
  });
  out.result(job, () => `job ${job.id} ${job.state}`);
}
