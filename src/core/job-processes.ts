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

/** The /proc entries of processes other than this one, above `floor` (a pid). */
function otherPids(floor = 0): string[] {
  let names: string[];
  try {
    names = readdirSync("/proc");
  } catch {
    return []; // no /proc: nothing is found
  }
  const self = String(process.pid);
  return names.filter((n) => n.charCodeAt(0) >= 48 && n.charCodeAt(0) <= 57 && n !== self && (floor === 0 || Number(n) > floor));
}

/**
 * The pid counter as a job's first process starts, to read fewer processes
 * at its end (pidFloor): taken before that process is started.
 */
export interface PidCounter {
  /** Tasks (threads included) given a pid since boot: /proc/stat's `processes`. */
  forks: number;
  /** Tasks alive: /proc/loadavg's fourth field, after the slash. */
  tasks: number;
  pidMax: number;
}

function readNumber(path: string, pattern: RegExp): number | null {
  try {
    const found = pattern.exec(readFileSync(path, "latin1"));
    return found ? Number(found[1]) : null;
  } catch {
    return null;
  }
}

/** Null without /proc (every scan then reads every process). */
export function readPidCounter(): PidCounter | null {
  const forks = readNumber("/proc/stat", /^processes (\d+)$/m);
  const tasks = readNumber("/proc/loadavg", /^\S+ \S+ \S+ \d+\/(\d+) /);
  const pidMax = readNumber("/proc/sys/kernel/pid_max", /^(\d+)/);
  return forks === null || tasks === null || pidMax === null ? null : { forks, tasks, pidMax };
}

/**
 * Below which pid none of a job's processes can be, given its first pid and
 * the counter before it started (0: they may be anywhere). Everything the
 * job starts gets a pid after its first, as Linux hands pids out in order,
 * unless the allocator wrapped around pid_max since. It moves past one pid
 * per task given one (`forks` now less then) and per pid it skips as taken,
 * at most every task alive then or born since: while those add up to less
 * than the pids above the first, it cannot have wrapped.
 */
export function pidFloor(first: number, before: PidCounter | null, now: PidCounter | null): number {
  if (!before || !now) return 0;
  const born = now.forks - before.forks;
  // pid_max lowered meanwhile: the allocator wraps at the lower one.
  return born >= 0 && before.tasks + 2 * born < Math.min(before.pidMax, now.pidMax) - first ? first : 0;
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

/**
 * The live processes carrying the job's mark (this process excluded). With
 * `from` (the job's first pid, and the counter before it started), only the
 * pids after it are read while pidFloor shows the allocator has not wrapped.
 */
export function jobProcesses(jobId: string, from?: { pid: number; before: PidCounter | null }): number[] {
  const needle = Buffer.from(`\0${jobMark(jobId)}\0`);
  const found: number[] = [];
  const floor = from ? pidFloor(from.pid, from.before, readPidCounter()) : 0;
  for (const pid of otherPids(floor)) {
    if (readEnviron(pid)?.includes(needle) && !isZombie(pid)) found.push(Number(pid));
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
export async function endJobProcesses(jobId: string, graceMs: number, from?: { pid: number; before: PidCounter | null }): Promise<number> {
  const first = jobProcesses(jobId, from);
  if (!first.length) return 0;
  signal(first, "SIGTERM");
  const deadline = Date.now() + graceMs;
  while (Date.now() < deadline) {
    await sleep(50);
    if (!jobProcesses(jobId, from).length) return first.length;
  }
  for (let round = 0; round < 5; round++) {
    const left = jobProcesses(jobId, from);
    if (!left.length) break;
    signal(left, "SIGKILL");
    await sleep(20);
  }
  return first.length;
}
