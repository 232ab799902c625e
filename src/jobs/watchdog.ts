import { readProcStat } from "../core/process-identity.ts";

/**
 * A job's watchdog: a small shell beside the job, in a session of its own,
 * that outlives whatever runs the job. Once a second it checks that the
 * runner (a `job run`, a worker) is still the process it was (its pid, not a
 * zombie, the same start time); when it is gone, it SIGKILLs every process
 * carrying the job's mark (core/job-processes.ts), a setsid child included,
 * and ends. So a job never outlives its runner by more than a second, even
 * when nothing of gpulayer runs on the machine afterwards. The runner ends
 * the watchdog itself when the job ends. It carries no mark of its own.
 *
 * The runner's start time comes from the runner (RS), and the first look is a
 * second in: nothing but the shell starts beside the job, whose own start
 * (a short job's whole life) has the CPUs to itself.
 */
const SCRIPT = [
  'stat_of() { sed "s/.*) //" /proc/$1/stat 2>/dev/null; }',
  // A runner without /proc: it watches nothing rather than take the job for orphaned.
  '[ -n "$RS" ] || exit 0',
  'alive() { s=$(stat_of $R); [ -n "$s" ] || return 1; set -- $s; [ "$1" != Z ] && [ "${20}" = "$RS" ]; }',
  "while sleep 1 && alive; do :; done",
  'for round in 1 2 3; do for f in /proc/[0-9]*/environ; do p=${f#/proc/}; p=${p%/environ}; tr "\\0" "\\n" < "$f" 2>/dev/null | grep -qxF "GPULAYER_JOB_ID=$J" && kill -KILL "$p" 2>/dev/null; done; sleep 0.2; done',
].join("\n");

export interface Watchdog {
  stop(): void;
}

/** Started right after the job's main process; null where there is no sh (the job then has its parent-death signal alone). */
export function watchJob(jobId: string, runnerPid: number, path: string): Watchdog | null {
  let proc: Bun.Subprocess;
  try {
    proc = Bun.spawn(["sh", "-c", SCRIPT], { env: { PATH: path, J: jobId, R: String(runnerPid), RS: String(readProcStat(runnerPid)?.starttime ?? "") }, stdin: "ignore", stdout: "ignore", stderr: "ignore", detached: true });
  } catch {
    return null;
  }
  proc.unref();
  return {
    stop() {
      try {
        process.kill(-proc.pid, "SIGKILL");
      } catch {
        // gone already
      }
    },
  };
}
