/**
 * How a task's command runs, behind one seam: a driver starts it (a process
 * here, or a container), stops it when asked, and says how it exited, its
 * output going to the sinks it is given as it comes. What is around it (the
 * log, the events, the job's record, cancel and its grace) is written once,
 * in jobs/run-task.ts, for every driver, on one machine and on a worker alike.
 */

/** Where the command's output goes as it comes. */
export interface OutputSinks {
  stdout(chunk: Uint8Array): void;
  stderr(chunk: Uint8Array): void;
}

export interface TaskExit {
  exitCode: number;
  /** The signal that ended it, when the driver knows it (its exit code is then 128 + the signal's number). */
  signal?: string | number;
}

export interface StartedTask {
  /** Its main process: the command's own, or the engine CLI's (`docker run`). */
  pid: number;
  /** What `task.run.started` says of it beside its pid and command (a container: its name and engine). */
  details: { container?: string; engine?: string };
  /** Ends it: SIGTERM, then SIGKILL after the driver's grace period. Once is enough; again does nothing more. */
  stop(): void;
  /** Once it has exited, its output has all come, and what it left behind has been ended. */
  exited: Promise<TaskExit>;
}

export interface TaskDriver {
  /** Throws CannotStart when the command cannot start at all (not found, not executable, no engine). */
  start(output: OutputSinks): Promise<StartedTask>;
}

/** The command could not be started: the task fails with ExitCode.cannotStart and this message, and nothing ran. */
export class CannotStart extends Error {}
