import { UserError } from "../errors.ts";
import { sleep } from "../env/lock.ts";
import { cancelGraceMs } from "./runner.ts";
import { runnerAlive } from "./status.ts";
import { FINAL_STATES, type JobRecord, type JobStore } from "./store.ts";

/**
 * Ask the job's runner to cancel (it owns the process group and records the
 * outcome); if the runner is gone, kill the group and record it here.
 */
export async function cancelJob(store: JobStore, job: JobRecord): Promise<JobRecord> {
  if (FINAL_STATES.includes(job.state)) throw new UserError(`job ${job.id} has already ended (${job.state})`);
  if (job.runnerPid && runnerAlive(job)) {
    process.kill(job.runnerPid, "SIGTERM");
    const deadline = Date.now() + cancelGraceMs() + 10_000;
    while (Date.now() < deadline) {
      const now = store.get(job.id)!;
      if (FINAL_STATES.includes(now.state)) return now;
      await sleep(100);
    }
    throw new UserError(`job ${job.id} did not stop in time; its runner is pid ${job.runnerPid}`);
  }
  const started = store.events(job.id).findLast((e) => e.type === "task.run.started");
  const container = started?.data.container as string | undefined;
  if (container) {
    // The runner died; the container lives on in the engine until removed.
    const { detectEngine, removeContainer } = await import("../docker/index.ts");
    const engine = await detectEngine(store.layout).catch(() => null);
    if (engine) await removeContainer(engine, container).catch(() => {});
  }
  if (job.childPid) {
    try {
      process.kill(-job.childPid, "SIGKILL");
    } catch {
      // already gone
    }
  }
  store.event(job.id, "job.cancelled", { reason: "job cancel (runner not running)" });
  store.update(job.id, { state: "cancelled", childPid: null });
  return store.get(job.id)!;
}
