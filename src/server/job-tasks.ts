import { FINAL_JOB_STATES } from "../cluster/protocol.ts";
import { ExitCode } from "../errors.ts";
import type { JobRow, ServerJobState, ServerStore } from "./store.ts";

/**
 * A job of several tasks on the server: the job's row is never dispatched;
 * each task is a row of its own (parent_id, task, needs), matched to a worker
 * on its own once every task it needs has succeeded. A task whose need
 * failed (or was skipped, or cancelled) is skipped, never started; the job
 * ends when all its tasks have, with the first failed task's exit code.
 */

/** What stops a queued task from being dispatched now: skip it (a need of it failed), or wait (for its needs); null: nothing. */
export async function taskBlocked(store: ServerStore, task: JobRow): Promise<{ skip: string } | { wait: string } | null> {
  if (!task.parentId) return null;
  const parent = await store.job(task.parentId);
  if (parent?.cancelRequested) return { skip: JOB_CANCELLED };
  if (!task.needs.length) return null;
  const siblings = new Map((await store.tasksOf(task.parentId)).map((t) => [t.task, t]));
  for (const n of task.needs) {
    const s = siblings.get(n)?.state;
    if (s && FINAL_JOB_STATES.includes(s) && s !== "succeeded") return { skip: `not started: ${n}, which it needs, ${s}` };
  }
  const pending = task.needs.filter((n) => siblings.get(n)?.state !== "succeeded");
  return pending.length ? { wait: `the tasks it needs (${pending.join(", ")})` } : null;
}

export const JOB_CANCELLED = "the job was cancelled";

/** Ended without ever starting (no exit code: nothing ran); `cancelled` when the job was cancelled first. */
export async function endUnstarted(store: ServerStore, task: JobRow, because: string): Promise<void> {
  const state: ServerJobState = because === JOB_CANCELLED ? "cancelled" : "skipped";
  await store.event(task.id, `task.${state}`, { because });
  await store.updateJob(task.id, { state, error: because, waiting: null, exitCode: null });
  if (task.parentId) await store.event(task.parentId, `task.${state}`, { task: task.task, because });
}

/**
 * The job's own row, from its tasks': running once one has started, ended
 * once all have. Returns whether the job's row changed (its watchers wake).
 */
export async function settleJob(store: ServerStore, parentId: string): Promise<boolean> {
  const job = await store.job(parentId);
  if (!job || FINAL_JOB_STATES.includes(job.state)) return false;
  const tasks = await store.tasksOf(parentId);
  // Each task's end, once, in the job's own events (skipped and cancelled ones were told by endUnstarted).
  const told = new Set((await store.events(parentId)).filter((e) => /^task\.(finished|skipped|cancelled)$/.test(e.type)).map((e) => e.data.task));
  let changed = false;
  for (const t of tasks) {
    if (!FINAL_JOB_STATES.includes(t.state) || told.has(t.task)) continue;
    await store.event(parentId, "task.finished", { task: t.task, state: t.state, exit_code: t.exitCode });
    changed = true;
  }
  if (tasks.every((t) => FINAL_JOB_STATES.includes(t.state))) {
    const failed = tasks.filter((t) => t.state === "failed").sort((a, b) => a.updated - b.updated)[0];
    const state: ServerJobState = job.cancelRequested ? "cancelled" : tasks.every((t) => t.state === "succeeded") ? "succeeded" : "failed";
    const exitCode = failed?.exitCode ?? (state === "cancelled" ? ExitCode.cancelled : state === "succeeded" ? 0 : ExitCode.failed);
    await store.event(parentId, "job.finished", { state, exit_code: exitCode, ...(failed ? { failed_task: failed.task } : {}) });
    await store.updateJob(parentId, { state, exitCode, error: failed ? `task ${failed.task} failed (exit ${failed.exitCode})` : null, waiting: null });
    return true;
  }
  if (job.state === "queued" && tasks.some((t) => t.state !== "queued")) {
    await store.updateJob(parentId, { state: "running" });
    return true;
  }
  return changed;
}
