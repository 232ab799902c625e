/**
 * The error taxonomy and the exit codes, in one place. A UserError is
 * something the user can fix and is shown as one line; anything else is a bug
 * in gpulayer and shows a stack only with --verbose. Turned into its line and
 * code once, by errorReport, in cli.ts.
 */
export const ExitCode = {
  ok: 0,
  /** The operation failed (a build, a pull, a lookup, a request to the server). */
  failed: 1,
  /** Bad flags, a bad job file, bad requirements. */
  usage: 2,
  /** EX_SOFTWARE: a bug in gpulayer. */
  internal: 70,
  /** A job's command could not be started (not found, not executable), as a shell says. */
  cannotStart: 127,
  /** A command ended by signal N exits signalBase + N, as a shell reports it. */
  signalBase: 128,
  /** Cancelled or interrupted: 128 + SIGINT. */
  cancelled: 130,
} as const;

export class UserError extends Error {
  override name = "UserError";
  constructor(
    message: string,
    readonly exitCode: number = ExitCode.failed,
  ) {
    super(message);
  }
}

/** Bad input: flags, files, specs. */
export class UsageError extends UserError {
  override name = "UsageError";
  constructor(message: string) {
    super(message, ExitCode.usage);
  }
}

/** An installer (pip, uv) failed; `detail` holds its own message. */
export class InstallError extends UserError {
  override name = "InstallError";
  constructor(
    message: string,
    readonly detail: string,
  ) {
    super(message, ExitCode.failed);
  }
}

/** A job bundle that is too big, damaged, or holds what it must not (packing, uploading, unpacking). */
export class BundleError extends UserError {
  override name = "BundleError";
}

/** An HTTP answer from a gpulayer server that was not a success, with the server's own message. */
export class HttpError extends UserError {
  override name = "HttpError";
  constructor(
    readonly status: number,
    message: string,
    readonly body: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

/** Ends the process with a code and no message (e.g. a job's own exit code: its status was already printed). */
export class ExitError extends Error {
  override name = "ExitError";
  constructor(readonly exitCode: number) {
    super(`exit ${exitCode}`);
  }
}

/** What a failure shows: its one line (empty for an ExitError, which shows nothing), its exit code, and the stack of a bug with --verbose. */
export interface ErrorReport {
  message: string;
  exitCode: number;
  stack?: string;
}

/** Any error, as the user sees it: the message and the exit code, the same way for every command. */
export function errorReport(error: unknown, opts: { verbose: boolean }): ErrorReport {
  if (error instanceof ExitError) return { message: "", exitCode: error.exitCode };
  if (error instanceof UserError) return { message: error.message, exitCode: error.exitCode };
  // citty's own parse errors (unknown command, missing argument) are usage errors.
  if (error instanceof Error && error.name === "CLIError") return { message: `${error.message.replace(/\u001b\[[0-9;]*m/g, "")} (see --help)`, exitCode: ExitCode.usage };
  const message = error instanceof Error ? error.message : String(error);
  return { message, exitCode: ExitCode.internal, ...(opts.verbose && error instanceof Error && error.stack ? { stack: error.stack } : {}) };
}
