import { isFinal, jobEnd, readiness } from "../jobs/model.ts";
import type { JobRow, ServerStore } from "./store.ts";

/**
 * A job of several tasks on the server: the job's row is never dispatched;
 * each task is a row of its own (parent_id, task, needs), matched to a worker
 * on its own once every task it needs has succeeded. The rule (which task
 * starts, which is skipped, how the job ends) is the one model's
 * (jobs/model/needs.ts), asked of the rows here.
 */

/** What stops a queued task from being dispatched now: skip it (a need of it failed), or wait (for its needs); null: nothing. */
export async function taskBlocked(store: ServerStore, task: JobRow): Promise<{ skip: string } | { wait: string } | null> {
  if (!task.parentId) return null;
  const parent = await store.job(task.parentId);
  const cancelled = Boolean(parent?.cancelRequested);
  const siblings = new Map(cancelled || !task.needs.length ? [] : (await store.tasksOf(task.parentId)).map((t) => [t.task, t]));
  const r = readiness(task.needs, (n) => siblings.get(n)?.state, cancelled);
  if ("end" in r) return { skip: r.end === "skipped" ? r.because : JOB_CANCELLED };
  return "wait" in r ? { wait: `the tasks it needs (${r.wait.join(", ")})` } : null;
}

export const JOB_CANCELLED = "the job was cancelled";

/** Ended without ever starting (no exit code: nothing ran); `cancelled` when the job was cancelled first. */
export async function endUnstarted(store: ServerStore, task: JobRow, because: string): Promise<void> {
  const state = because === JOB_CANCELLED ? "cancelled" : "skipped";
  await store.event(task.id, `task.${state}` as const, { because });
  await store.updateJob(task.id, { state, error: because, waiting: null, exitCode: null });
  if (task.parentId) await store.event(task.parentId, `task.${state}` as const, { task: task.task, because });
}

/**
 * The job's own row, from its tasks': running once one has started, ended
 * once all have. Returns whether the job's row changed (its watchers wake).
 */
export async function settleJob(store: ServerStore, parentId: string): Promise<boolean> {
  const job = await store.job(parentId);
  if (!job || isFinal(job.state)) return false;
  const tasks = await store.tasksOf(parentId);
  // Each task's end, once, in the job's own events (skipped and cancelled ones were told by endUnstarted).
  const told = new Set((await store.events(parentId)).filter((e) => /^task\.(finished|skipped|cancelled)$/.test(e.type)).map((e) => e.data.task));
  let changed = false;
  for (const t of tasks) {
    if (!isFinal(t.state) || told.has(t.task)) continue;
    await store.event(parentId, "task.finished", { task: t.task, state: t.state, exit_code: t.exitCode });
    changed = true;
  }
  if (tasks.every((t) => isFinal(t.state))) {
    const failed = tasks.filter((t) => t.state === "failed").sort((a, b) => a.updated - b.updated)[0];
    const end = jobEnd(
      tasks.map((t) => t.state),
      job.cancelRequested,
      failed ? { task: failed.task, exitCode: failed.exitCode } : null,
    );
    await store.event(parentId, "job.finished", end.event);
    await store.updateJob(parentId, { state: end.state, exitCode: end.exitCode, error: end.error, waiting: null });
    return true;
  }
  if (job.state === "queued" && tasks.some((t) => t.state !== "queued")) {
    await store.updateJob(parentId, { state: "running" });
    return true;
  }
  return changed;
}
