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

/** The disk (ENOSPC) or the user's quota (EDQUOT) ran out while writing: the user frees space; nothing half-made was kept. */
export class DiskFullError extends UserError {
  override name = "DiskFullError";
}

/** How the two conditions read, first in an errno error's code, then in an installer's own words (any locale: the errno too). */
export const NO_SPACE = {
  ENOSPC: { words: "no space left on device", said: /No space left on device|\[Errno 28\]|os error 28\b/ },
  EDQUOT: { words: "disk quota exceeded", said: /Disk quota exceeded|\[Errno 122\]|os error 122\b/ },
} as const;

/**
 * Something wrong with the Python a request names, said without naming where it was named: the request that
 * knows (--python, GPULAYER_PYTHON, the config file, `join --python`'s save, a job file) puts its own name first.
 */
export class PythonProblem extends UsageError {
  override name = "PythonProblem";
  constructor(readonly problem: string) {
    super(`--python: ${problem}`);
  }
}

/**
 * The exit code a job's end passes on (`job run`, `job logs --follow`, here or remote): 130 for a cancelled job
 * (its command's own is 143 after the cancel's SIGTERM; Ctrl-C on `job run` must read as an interrupt), else
 * its own, else 0 for a success and 1 for anything else.
 */
export function jobEndCode(exitCode: number | null, state: string): number {
  if (state === "cancelled") return ExitCode.cancelled;
  return exitCode ?? (state === "succeeded" ? ExitCode.ok : ExitCode.failed);
}

/** ENOSPC or EDQUOT when `error` is a system call's failure for want of space; null otherwise. */
export function noSpaceCode(error: unknown): keyof typeof NO_SPACE | null {
  const code = (error as NodeJS.ErrnoException | null)?.code;
  // SQLite says a full disk in its own words (bun:sqlite's SQLiteError): a job store or outbox that cannot grow.
  if (code === "SQLITE_FULL") return "ENOSPC";
  return code === "ENOSPC" || code === "EDQUOT" ? code : null;
}

/**
 * A file gpulayer may not read or write (a home of another user, a read-only mount) met where no step said more:
 * the user's to fix, named by the call and the path, never an internal error.
 */
function permissionProblem(error: unknown): string | null {
  const e = error as (NodeJS.ErrnoException & { code?: string }) | null;
  // SQLite says it in its own words (bun:sqlite's SQLiteError): a job store or outbox this user cannot write.
  if (e?.code?.startsWith("SQLITE_READONLY")) return "a database in gpulayer's home is read-only to this user (its job store or outbox; GPULAYER_HOME chooses another home)";
  if (e?.code !== "EACCES" && e?.code !== "EPERM" && e?.code !== "EROFS") return null;
  const why = e.code === "EROFS" ? "a read-only file system" : "permission denied";
  if (!e.path) return `${why}: ${e.message}`;
  return `${why}: cannot ${ACTION_OF_CALL[e.syscall ?? ""] ?? "use"} ${e.path}${e.syscall ? ` (${e.syscall})` : ""}`;
}

/** A system call in the words of what it was for. */
const ACTION_OF_CALL: Record<string, string> = { scandir: "list", opendir: "list", mkdir: "create", open: "open", rename: "rename", unlink: "remove", rmdir: "remove", rm: "remove", stat: "read", lstat: "read", read: "read", write: "write", utime: "touch", copyfile: "copy", symlink: "link", link: "link", chmod: "change", chown: "change" };

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
  // A full disk met outside a build (which says more: env/build/disk-full.ts) is still the user's to fix, not a bug.
  const full = noSpaceCode(error);
  if (full) {
    const path = (error as NodeJS.ErrnoException).path;
    return { message: `${NO_SPACE[full].words} while writing ${path ?? "gpulayer's files"}`, exitCode: ExitCode.failed };
  }
  const denied = permissionProblem(error);
  if (denied) return { message: denied, exitCode: ExitCode.failed };
  if (error instanceof Error && error.name === "CLIError") {
    // citty's own words in ours: lower case, no full stop, no colour (`Unknown command prepar` → `unknown command prepar`).
    const words = error.message.replace(/\u001b\[[0-9;]*m/g, "").replace(/\.$/, "");
    return { message: `${words.charAt(0).toLowerCase()}${words.slice(1)} (see --help)`, exitCode: ExitCode.usage };
  }
  const message = error instanceof Error ? error.message : String(error);
  return { message, exitCode: ExitCode.internal, ...(opts.verbose && error instanceof Error && error.stack ? { stack: error.stack } : {}) };
}
