import { existsSync, readFileSync } from "node:fs";

/**
 * A recorded process is its pid AND the moment it started: pids are reused,
 * so a pid alone may name some other process by the time anyone looks. Both
 * are kept together; a process counts as the recorded one only when the pid
 * exists and its start time is the one recorded, and nothing is signalled
 * on a pid whose start time does not match.
 *
 * Linux: field 22 (`starttime`) of /proc/PID/stat, clock ticks since boot,
 * with the boot id kept beside it (after a reboot, ticks start again).
 * Elsewhere: `ps -o lstart=`, the start as wall-clock seconds.
 *
 * The one place for process liveness. Two readings of the same answer:
 * signalling (`signalRecorded`) needs "alive", the proven same process;
 * holders of locks and leases (`mayBeRunning`) keep holding unless "gone".
 */
export interface RecordedProcess {
  pid: number | null;
  /** The start time recorded with the pid; null for records older than start times (cannot be told apart). */
  start: number | null;
  /** The boot the pid was recorded in (Linux); null when unknown. */
  boot?: string | null;
}

/** alive: this very process; gone: ended (or the pid is now another process's); unverifiable: exists, but no start time to compare. */
export type Liveness = "alive" | "gone" | "unverifiable";

export interface ProcStat {
  pid: number;
  /** Field 3: R, S, D, Z (zombie), X (dead), ... */
  state: string;
  ppid: number;
  pgrp: number;
  session: number;
  /** Field 22: clock ticks since boot. */
  starttime: number;
}

/**
 * /proc/PID/stat read robustly: the command name (field 2) sits in parentheses
 * and may itself hold spaces and parentheses, so fields are counted from the
 * last ")" in the line.
 */
export function readProcStat(pid: number): ProcStat | null {
  if (!Number.isSafeInteger(pid) || pid <= 0) return null;
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, "latin1");
  } catch {
    return null;
  }
  const close = text.lastIndexOf(")");
  if (close < 0) return null;
  // After ") ": field 3 (state) is index 0, so field N is index N - 3.
  const f = text.slice(close + 2).trim().split(/\s+/);
  const num = (n: number): number | null => {
    const s = f[n - 3];
    return s !== undefined && /^-?\d+$/.test(s) ? Number(s) : null;
  };
  const [ppid, pgrp, session, starttime] = [num(4), num(5), num(6), num(22)];
  if (!f[0] || ppid === null || pgrp === null || session === null || starttime === null) return null;
  return { pid, state: f[0], ppid, pgrp, session, starttime };
}

let procfs: boolean | undefined;
const hasProcfs = () => (procfs ??= existsSync("/proc/self/stat"));

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/** `ps -o lstart=` (BSD, macOS): "Mon Jun  3 10:11:12 2024", read as seconds (the clock's zone is the same for every reading). */
function psStart(pid: number): number | null {
  try {
    const r = Bun.spawnSync(["ps", "-o", "lstart=", "-p", String(pid)], { env: { LC_ALL: "C", PATH: "/bin:/usr/bin:/usr/sbin:/sbin" }, stdout: "pipe", stderr: "ignore", stdin: "ignore" });
    if (r.exitCode !== 0) return null;
    const m = /^\w{3}\s+(\w{3})\s+(\d{1,2})\s+(\d{1,2}):(\d{2}):(\d{2})\s+(\d{4})$/.exec(r.stdout.toString().trim());
    if (!m) return null;
    const month = MONTHS.indexOf(m[1]!);
    if (month < 0) return null;
    return Date.UTC(Number(m[6]), month, Number(m[2]), Number(m[3]), Number(m[4]), Number(m[5])) / 1000;
  } catch {
    return null;
  }
}

/** The start time of a running process (see above), or null when it does not exist, has ended (a zombie) or cannot be read. */
export function processStartTime(pid: number): number | null {
  if (!Number.isSafeInteger(pid) || pid <= 0) return null;
  if (hasProcfs()) {
    const stat = readProcStat(pid);
    if (!stat || stat.state === "Z" || stat.state === "X") return null;
    return stat.starttime;
  }
  return psStart(pid);
}

let boot: string | null | undefined;
/** This boot's id (Linux); null elsewhere. */
export function bootId(): string | null {
  if (boot === undefined) {
    try {
      boot = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim() || null;
    } catch {
      boot = null;
    }
  }
  return boot;
}

/** What to record beside a pid: its start time now and the boot. */
export function identify(pid: number): { start: number | null; boot: string | null } {
  return { start: pid === process.pid ? ownStartTime() : processStartTime(pid), boot: bootId() };
}

let ownStart: number | null | undefined;
/** This process's start time, read once (without /proc it costs a `ps`, and locks ask for it on every try). */
export function ownStartTime(): number | null {
  if (ownStart === undefined) ownStart = processStartTime(process.pid);
  return ownStart;
}

/**
 * A start time as a record holds it: a number; lock and lease files written
 * before start times were numbers hold /proc's ticks as a string ("" when
 * unknown). Anything else: none recorded.
 */
export function recordedStart(value: unknown): number | null {
  if (typeof value === "number") return Number.isSafeInteger(value) ? value : null;
  if (typeof value === "string" && /^\d+$/.test(value)) return Number(value);
  return null;
}

function pidExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Is the recorded process still running? Only reads (/proc, or `ps`); signal 0
 * alone for records without a start time, which are then at most unverifiable.
 */
export function liveness(p: RecordedProcess): Liveness {
  const pid = p.pid;
  if (pid === null || !Number.isSafeInteger(pid) || pid <= 0) return "gone";
  if (p.start === null || p.start === undefined) {
    if (hasProcfs()) {
      const stat = readProcStat(pid);
      return stat && stat.state !== "Z" && stat.state !== "X" ? "unverifiable" : "gone";
    }
    return pidExists(pid) ? "unverifiable" : "gone";
  }
  const here = bootId();
  if (p.boot && here && p.boot !== here) return "gone"; // rebooted since: every process of then has ended
  const now = processStartTime(pid);
  if (now === null) return hasProcfs() || !pidExists(pid) ? "gone" : "unverifiable";
  return now === p.start ? "alive" : "gone";
}

/**
 * For holders (a lock's owner, a lease's process): whether it may still hold
 * what it holds. Only a provably ended process lets go; one that cannot be
 * told apart (no start time recorded, or none readable) still holds. Never
 * a reason to signal: that takes `signalRecorded`, which needs "alive".
 */
export function mayBeRunning(p: RecordedProcess): boolean {
  return liveness(p) !== "gone";
}

export type SignalOutcome = "signalled" | "gone" | "unverifiable";

/**
 * Signal a recorded process (with group: the process group it leads, or itself
 * alone when it leads none), only after checking that the pid is still that
 * process: its start time must match the recorded one. A pid now held by
 * another process, or one recorded without a start time, is never signalled.
 * (Check and signal are two steps; the window between them is microseconds,
 * against pid reuse that takes a whole cycle through the pid space.)
 */
export function signalRecorded(p: RecordedProcess, signal: NodeJS.Signals, opts: { group?: boolean } = {}): SignalOutcome {
  const state = liveness(p);
  if (state !== "alive") return state;
  const pid = p.pid!;
  // The group only when this process still leads it (its pgid is its own pid); else the process alone.
  let group = Boolean(opts.group);
  if (group && hasProcfs()) group = readProcStat(pid)?.pgrp === pid;
  try {
    process.kill(group ? -pid : pid, signal);
    return "signalled";
  } catch {
    return "gone";
  }
}
