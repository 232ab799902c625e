import { closeSync, openSync, readdirSync, readFileSync, readSync } from "node:fs";
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

/** The /proc entries of processes other than this one. */
function otherPids(): string[] {
  let names: string[];
  try {
    names = readdirSync("/proc");
  } catch {
    return []; // no /proc: nothing is found
  }
  const self = String(process.pid);
  return names.filter((n) => n.charCodeAt(0) >= 48 && n.charCodeAt(0) <= 57 && n !== self);
}

// One buffer for every read: a scan runs at each job's end, and /proc holds hundreds of processes on a busy box.
let environ = Buffer.allocUnsafe(64 * 1024);

/**
 * A process's environment, NUL before and after (so each variable sits between two NULs), in a buffer shared by
 * every call: valid until the next one. Null when it is gone or not ours to read.
 */
function readEnviron(pid: string): Buffer | null {
  let fd: number;
  try {
    fd = openSync(`/proc/${pid}/environ`, "r");
  } catch {
    return null;
  }
  try {
    environ[0] = 0;
    let length = 1;
    for (;;) {
      // Room for the read and the closing NUL; a larger environment grows the buffer for every later read too.
      if (environ.length - length < 4096) environ = Buffer.concat([environ, Buffer.allocUnsafe(environ.length)]);
      const n = readSync(fd, environ, length, environ.length - length - 1, null);
      if (n === 0) break;
      length += n;
    }
    environ[length] = 0;
    return environ.subarray(0, length + 1);
  } catch {
    return null;
  } finally {
    closeSync(fd);
  }
}

/** The live processes carrying the job's mark (this process excluded). */
export function jobProcesses(jobId: string): number[] {
  return markedProcesses(jobId).map((p) => p.pid);
}

/** The same, each with its process group. */
function markedProcesses(jobId: string): { pid: number; group: number }[] {
  const needle = Buffer.from(`\0${jobMark(jobId)}\0`);
  const found: { pid: number; group: number }[] = [];
  for (const pid of otherPids()) {
    if (!readEnviron(pid)?.includes(needle)) continue;
    const stat = statOf(pid);
    if (stat && !stat.zombie) found.push({ pid: Number(pid), group: stat.group });
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
  const prefix = Buffer.from(`\0${MARK}=`);
  for (const pid of otherPids()) {
    const env = readEnviron(pid);
    const at = env ? env.indexOf(prefix) : -1;
    if (at === -1 || isZombie(pid)) continue;
    const start = at + prefix.length;
    const id = env!.toString("latin1", start, env!.indexOf(0, start));
    counts.set(id, (counts.get(id) ?? 0) + 1);
  }
  snapshot = { at: now, counts };
  return counts;
}

function isZombie(pid: string): boolean {
  return statOf(pid)?.zombie ?? true;
}

/** A process's state and group from /proc/PID/stat (after the name, which may hold anything: "S ppid pgrp ..."); null when gone. */
function statOf(pid: string): { zombie: boolean; group: number } | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return { zombie: fields[0] === "Z", group: Number(fields[2]) };
  } catch {
    return null;
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

/**
 * End every process of the job: SIGTERM, then SIGKILL what is left after the grace (at once without one); resolves
 * when none is left (or after a last SIGKILL round). `termedGroup`: a process group the caller has just sent SIGTERM, whose members are
 * not sent a second (a program that checkpoints on the first SIGTERM may take a second as "abort now").
 */
export async function endJobProcesses(jobId: string, graceMs: number, termedGroup?: number): Promise<number> {
  const found = markedProcesses(jobId);
  if (!found.length) return 0;
  // No grace: SIGKILL alone (a SIGTERM just before it would only be a second signal to one that had its first).
  if (graceMs > 0)
    signal(
      found.filter((p) => p.group !== termedGroup).map((p) => p.pid),
      "SIGTERM",
    );
  const first = found.map((p) => p.pid);
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
