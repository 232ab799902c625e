/**
 * The error taxonomy: a UserError is something the user can fix and is shown
 * as one line; anything else is a bug in gpulayer and shows a stack only with
 * --verbose. Handled once, in cli.ts.
 */
export const ExitCode = {
  ok: 0,
  failed: 1, // the operation failed (a build, a pull, a lookup)
  usage: 2, // bad flags, bad job file, bad requirements
  internal: 70, // EX_SOFTWARE: a bug
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

/** Ends the process with a code and no message (e.g. a job's own exit code). */
export class ExitError extends Error {
  override name = "ExitError";
  constructor(readonly exitCode: number) {
    super(`exit ${exitCode}`);
  }
}
