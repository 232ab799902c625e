import { readdirSync, readFileSync } from "node:fs";
import { sleep } from "./sleep.ts";

/**
 * A job's processes, as a whole: every process whose environment carries the
 * job's mark (`GPULAYER_JOB_ID=<id>`, which each job gets and everything it
 * starts inherits), whatever its process group or session: a `setsid` or
 * double-forked child is found as surely as a plain one, and so are the
 * leftovers of a job whose runner died. Read from /proc (environments of this
 * user's processes, or all of them as root); a process that replaces its
 * whole environment escapes, and is documented as such.
 */

const MARK = "GPULAYER_JOB_ID";

const jobMark = (jobId: string) => `${MARK}=${jobId}`;

/** The live processes carrying the job's mark (this process excluded). */
export function jobProcesses(jobId: string): number[] {
  const needle = Buffer.from(`\0${jobMark(jobId)}\0`);
  let names: string[];
  try {
    names = readdirSync("/proc");
  } catch {
    return [];
  }
  const found: number[] = [];
  for (const name of names) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    try {
      // The variable may come first: give it a NUL before, as between the others.
      const environ = Buffer.concat([Buffer.from([0]), readFileSync(`/proc/${name}/environ`), Buffer.from([0])]);
      if (environ.includes(needle) && !isZombie(name)) found.push(Number(name));
    } catch {
      // gone, or not ours to read
    }
  }
  return found;
}

let snapshot: { at: number; counts: Map<string, number> } | null = null;

/**
 * How many live processes carry each job's mark, from one pass over /proc
 * (kept a second): a reader showing many jobs asks per job, and scans once.
 */
export function markedJobCounts(now = Date.now()): Map<string, number> {
  if (snapshot && now - snapshot.at < 1000) return snapshot.counts;
  const counts = new Map<string, number>();
  const prefix = `\0${MARK}=`;
  let names: string[] = [];
  try {
    names = readdirSync("/proc");
  } catch {
    // no /proc: nothing is found
  }
  for (const name of names) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    try {
      const environ = `\0${readFileSync(`/proc/${name}/environ`, "latin1")}`;
      const at = environ.indexOf(prefix);
      if (at === -1 || isZombie(name)) continue;
      const end = environ.indexOf("\0", at + 1);
      const id = environ.slice(at + prefix.length, end === -1 ? undefined : end);
      counts.set(id, (counts.get(id) ?? 0) + 1);
    } catch {
      // gone, or not ours to read
    }
  }
  snapshot = { at: now, counts };
  return counts;
}

function isZombie(pid: string): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) === "Z";
  } catch {
    return true;
  }
}

function signal(pids: number[], sig: NodeJS.Signals): void {
  for (const pid of pids) {
    try {
      process.kill(pid, sig);
    } catch {
      // gone already
    }
  }
}

/** End every process of the job: SIGTERM, then SIGKILL what is left after the grace; resolves when none is left (or after a last SIGKILL round). */
export async function endJobProcesses(jobId: string, graceMs: number): Promise<number> {
  const first = jobProcesses(jobId);
  if (!first.length) return 0;
  signal(first, "SIGTERM");
  const deadline = Date.now() + graceMs;
  while (Date.now() < deadline) {
    await sleep(50);
    if (!jobProcesses(jobId).length) return first.length;
  }
  for (let round = 0; round < 5; round++) {
    const left = jobProcesses(jobId);
    if (!left.length) break;
    signal(left, "SIGKILL");
    await sleep(20);
  }
  return first.length;
}
