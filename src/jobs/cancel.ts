import { UserError } from "../errors.ts";
import { endJobProcesses } from "../core/job-processes.ts";
import { sleep } from "../core/sleep.ts";
import type { EngineHost } from "../docker/engine.ts";
import { liveness, type RecordedProcess, signalRecorded } from "../core/process-identity.ts";
import { FINAL_STATES } from "./model.ts";
import type { JobRecord, JobStore } from "./store.ts";

/**
 * Ask the job's runner to cancel (it owns the process group and records the
 * outcome); if the runner is gone, kill the group and record it here. A
 * recorded pid is signalled only while its start time is the recorded one: a
 * pid that now belongs to another process is never touched.
 */
export async function cancelJob(store: JobStore, job: JobRecord, opts: { cancelGraceMs: number; engine: EngineHost }): Promise<JobRecord> {
  if (FINAL_STATES.includes(job.state)) throw new UserError(`job ${job.id} has already ended (${job.state})`);
  const runner: RecordedProcess = { pid: job.runnerPid, start: job.runnerStart, boot: job.pidBoot };
  const runnerState = liveness(runner);
  if (job.runnerPid && runnerState === "unverifiable") {
    throw new UserError(`job ${job.id}: its runner, pid ${job.runnerPid}, was recorded without a start time, so it cannot be told from another process that has that pid now; not signalling it`);
  }
  // Said before the signal: the runner reads it to record who cancelled (a SIGTERM alone could come from anyone).
  if (job.runnerPid && runnerState === "alive") store.event(job.id, "job.cancel.requested", { by: "job cancel" });
  if (job.runnerPid && runnerState === "alive" && signalRecorded(runner, "SIGTERM") === "signalled") {
    const deadline = Date.now() + opts.cancelGraceMs + 10_000;
    for (;;) {
      const now = store.get(job.id)!;
      if (FINAL_STATES.includes(now.state)) return now;
      // The runner ended without recording an end (killed meanwhile): what is left is ended below.
      if (liveness(runner) === "gone") {
        job = store.get(job.id)!; // read again: it may have recorded its end just before exiting
        if (FINAL_STATES.includes(job.state)) return job;
        break;
      }
      if (Date.now() >= deadline) throw new UserError(`job ${job.id} did not stop in time; its runner is pid ${job.runnerPid}`);
      await sleep(100);
    }
  }
  // A job of tasks whose runner is gone: each task not ended yet is ended as a job of its own would be.
  for (const task of store.tasks(job.id)) {
    if (FINAL_STATES.includes(task.state)) continue;
    await endWithoutRunner(store, task, opts);
  }
  return endWithoutRunner(store, job, opts);
}

/** What is left of a job (or task) whose runner is gone: its container, its process group, what carries its mark. */
async function endWithoutRunner(store: JobStore, job: JobRecord, opts: { engine: EngineHost }): Promise<JobRecord> {
  const started = store.events(job.id).findLast((e) => e.type === "task.run.started");
  const container = started?.data.container as string | undefined;
  if (container) {
    // The runner died; the container lives on in the engine until removed.
    const { detectEngine, removeContainer } = await import("../docker/index.ts");
    const engine = await detectEngine(store.layout, opts.engine).catch(() => null);
    if (engine) await removeContainer(engine, container, opts.engine.env).catch(() => {});
  }
  // The command's process group, if its leader is still the process recorded (same start time).
  const child = job.childPid ? signalRecorded({ pid: job.childPid, start: job.childStart, boot: job.pidBoot }, "SIGKILL", { group: true }) : null;
  // And whatever else carries the job's mark: what its main process left when it died with the runner (a child, a setsid one).
  const leftovers = await endJobProcesses(job.id, 0);
  store.event(job.id, "job.cancelled", { reason: "job cancel (runner not running)", ...(child ? { child_pid: job.childPid, child } : {}), ...(leftovers ? { leftovers } : {}) });
  store.update(job.id, { state: "cancelled", childPid: null, childStart: null });
  return store.get(job.id)!;
}
