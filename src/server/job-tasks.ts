import { isFinal, jobEnd, readiness, unstartedEnds } from "../jobs/model.ts";
import type { JobRow, ServerStore } from "./store.ts";

/**
 * A job of several tasks on the server: the job's row is never dispatched;
 * each task is a row of its own (parent_id, task, needs), matched to a worker
 * on its own once every task it needs has succeeded. The rule (which task
 * starts, which is skipped, how the job ends) is the one model's
 * (jobs/model/needs.ts), asked of the rows here.
 */

/** Why queued tasks are not dispatched now: `skips` end unstarted, in the order their needs ended (a need before what needs it); `waits` say for what. */
export interface Blocked {
  skips: { task: JobRow; because: string }[];
  waits: Map<string, string>;
}

/**
 * What stops each queued task from being dispatched now, for all of them at
 * once, by the one model's rule (jobs/model/needs.ts): each job's tasks are
 * read once, and the rule is linear in tasks and needs, however long the
 * chain a failure ends.
 */
export async function blockedTasks(store: ServerStore, queued: JobRow[]): Promise<Blocked> {
  const blocked: Blocked = { skips: [], waits: new Map() };
  const byParent = new Map<string, JobRow[]>();
  for (const t of queued) if (t.parentId) (byParent.get(t.parentId) ?? byParent.set(t.parentId, []).get(t.parentId)!).push(t);
  for (const [parentId, waiting] of byParent) {
    const cancelled = Boolean((await store.job(parentId))?.cancelRequested);
    const state = new Map(cancelled ? [] : (await store.tasksOf(parentId)).map((t) => [t.task!, t.state as string]));
    const rows = new Map(waiting.map((t) => [t.task!, t]));
    const tasks = waiting.map((t) => ({ name: t.task!, needs: t.needs }));
    for (const e of unstartedEnds(tasks, (n) => state.get(n), (n) => rows.has(n), cancelled)) {
      blocked.skips.push({ task: rows.get(e.task)!, because: e.because ?? JOB_CANCELLED });
      state.set(e.task, e.end);
    }
    for (const t of waiting) {
      const r = readiness(t.needs, (n) => state.get(n), false);
      if ("wait" in r && !isFinal(state.get(t.task!) ?? "")) blocked.waits.set(t.id, `the tasks it needs (${r.wait.join(", ")})`);
    }
  }
  return blocked;
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
 * The job's row is locked first, whoever settles it (a task's end under row
 * locks, a dispatch pass skipping what needs a failed task, a cancel): two
 * changes ending its last tasks at once then each see the other's end,
 * rather than each miss it and leave the job running.
 */
export async function settleJob(store: ServerStore, parentId: string): Promise<boolean> {
  await store.lockJob(parentId);
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
