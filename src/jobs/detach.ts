import { existsSync } from "node:fs";
import type { JobRecord, JobStore } from "./store.ts";
import { runnerAlive } from "./status.ts";
import { FINAL_STATES } from "./store.ts";

/** How to start this same gpulayer again: the compiled binary alone, or bun plus the entry script. */
export function selfCommand(): string[] {
  const script = process.argv[1];
  if (script && !script.startsWith("/$bunfs") && /\.(ts|js|mjs)$/.test(script) && existsSync(script)) return [process.execPath, script];
  return [process.execPath];
}

/**
 * Start `gpulayer job _exec ID` in its own session, detached from this terminal.
 * The whole spec goes on its stdin: the store holds it without credentials, and
 * process arguments are readable by every user.
 */
export function spawnDetachedRunner(job: JobRecord, env: NodeJS.ProcessEnv): number {
  const proc = Bun.spawn([...selfCommand(), "job", "_exec", job.id], { env: env as Record<string, string>, stdin: new Blob([JSON.stringify(job.spec)]), stdout: "ignore", stderr: "ignore", detached: true });
  proc.unref();
  return proc.pid;
}

/** A job whose runner died (SIGKILL, reboot) is recorded as failed the next time anyone looks. */
export function reconcile(store: JobStore, job: JobRecord): JobRecord {
  if (FINAL_STATES.includes(job.state) || !job.runnerPid || runnerAlive(job)) return job;
  if (job.childPid) {
    try {
      process.kill(-job.childPid, "SIGKILL");
    } catch {
      // gone
    }
  }
  const error = "the gpulayer process running this job died";
  store.event(job.id, "job.lost", { message: error });
  store.update(job.id, { state: "failed", error, childPid: null });
  return store.get(job.id)!;
}
