import { existsSync } from "node:fs";
import { withUmask } from "../core/owner-only.ts";
import type { JobRecord, JobStore } from "./store.ts";
import { shownJob } from "./status.ts";

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
export function spawnDetachedRunner(job: JobRecord, env: NodeJS.ProcessEnv, jobUmask: number | undefined): number {
  // Started with the caller's umask, which the background runner records as its own and gives the job.
  const proc = Bun.spawn(withUmask([...selfCommand(), "job", "_exec", job.id], jobUmask), { env: env as Record<string, string>, stdin: new Blob([JSON.stringify(job.spec)]), stdout: "ignore", stderr: "ignore", detached: true });
  proc.unref();
  return proc.pid;
}

/**
 * A job whose runner died (SIGKILL, OOM, reboot) as readers show it: failed, with
 * the reason (see shownJob). Reads never write and never signal: no event, no
 * update, no kill; a pid is only ever taken for the runner when its start time
 * matches the recorded one. Ending what is left of the job is `job cancel`'s.
 */
export function reconcile(_store: JobStore, job: JobRecord): JobRecord {
  return shownJob(job);
}
