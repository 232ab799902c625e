import { endJobProcesses } from "../../core/job-processes.ts";
import { withUmask } from "../../core/owner-only.ts";
import { ExitCode } from "../../errors.ts";
import { jobArgv, type RunAs, runAsEnv } from "../run-as.ts";
import { watchJob } from "../watchdog.ts";
import { CannotStart, type OutputSinks, type StartedTask, type TaskDriver } from "./driver.ts";

/**
 * The command as a process of this machine: in a process group of its own
 * (so a stop reaches every child), through setpriv where there is one (a
 * parent-death signal; worker.run_as's user), with the umask gpulayer was
 * started with, and a watchdog (jobs/watchdog.ts) that ends it within a
 * second if whatever runs it dies. Once its main process exits, what it left
 * behind (in its group, or setsid and carrying the job's mark) is ended too.
 */

export interface ProcessTask {
  /** The job's id: its processes carry it (GPULAYER_JOB_ID), and stop and the watchdog find them by it. */
  jobId: string;
  argv: string[];
  workdir: string;
  /** Its whole environment (PATH included: the command is looked up on it). */
  env: Record<string, string>;
  /** SIGTERM, then SIGKILL this much later. */
  graceMs: number;
  setpriv: string | null;
  runAs?: RunAs;
  /** The umask it runs with (gpulayer itself runs under 077). */
  umask?: number;
  /** The PATH the watchdog's shell runs with. */
  watchdogPath: string;
}

const SIGNALS: Record<string, number> = { SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGKILL: 9, SIGTERM: 15 };

function killGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    // the group is gone already
  }
}

export function processDriver(task: ProcessTask): TaskDriver {
  return {
    async start(output: OutputSinks): Promise<StartedTask> {
      const env = task.runAs ? { ...task.env, ...runAsEnv(task.runAs) } : task.env;
      const program = task.argv[0]!;
      let child: Bun.Subprocess<"ignore", "pipe", "pipe">;
      try {
        // Looked up as exec would, here: through setpriv the failure would read as setpriv's own.
        if (!Bun.which(program, { PATH: env.PATH, cwd: task.workdir })) throw new Error(program.includes("/") ? "no such file, or not executable" : "not found on the job's PATH (the env's bin first), or not executable");
        child = Bun.spawn(jobArgv(withUmask(task.argv, task.umask), task.setpriv, task.runAs), { cwd: task.workdir, env, stdin: "ignore", stdout: "pipe", stderr: "pipe", detached: true });
      } catch (error) {
        throw new CannotStart(`cannot start ${program}: ${(error as Error).message}`);
      }
      const pid = child.pid;
      // If whatever runs the job dies, what the job started is ended within a second.
      const watchdog = watchJob(task.jobId, process.pid, task.watchdogPath);
      let stopped = false;
      /** A cancel's end of the job's processes: SIGTERM, the grace, then SIGKILL (core/job-processes.ts). */
      let stopping: Promise<number> | null = null;
      let killTimer: ReturnType<typeof setTimeout> | undefined;
      const pump = async (stream: ReadableStream<Uint8Array>, sink: (c: Uint8Array) => void) => {
        for await (const chunk of stream) sink(chunk);
      };
      const pumped = Promise.all([pump(child.stdout, output.stdout), pump(child.stderr, output.stderr)]);
      const exited = (async () => {
        try {
          await child.exited;
          if (stopping) {
            // Cancelled: the grace holds for what the main process leaves too (a shell that died at once, its child checkpointing on
            // the same SIGTERM), then SIGKILL for whatever is left.
            await stopping;
            killGroup(pid, "SIGKILL");
          } else {
            // The job ends with its main process: what it left behind (in its group, or setsid and holding its output) is ended too.
            killGroup(pid, "SIGTERM");
            await endJobProcesses(task.jobId, task.graceMs, pid);
          }
          await pumped;
          const signal = child.signalCode;
          return { exitCode: child.exitCode ?? ExitCode.signalBase + (signal ? (SIGNALS[signal] ?? 0) : 0), ...(signal ? { signal } : {}) };
        } finally {
          clearTimeout(killTimer);
          watchdog?.stop();
        }
      })();
      return {
        pid,
        details: {},
        stop() {
          if (stopped) return;
          stopped = true;
          killGroup(pid, "SIGTERM");
          killTimer = setTimeout(() => killGroup(pid, "SIGKILL"), task.graceMs);
          // And whatever left the group (setsid, a daemon): every process with the job's mark, the group's members not signalled twice.
          stopping = endJobProcesses(task.jobId, task.graceMs, pid);
        },
        exited,
      };
    },
  };
}
