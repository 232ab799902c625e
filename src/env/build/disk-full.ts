import { existsSync, statfsSync } from "node:fs";
import { dirname, relative, sep } from "node:path";
import { DiskFullError, InstallError, NO_SPACE, noSpaceCode } from "../../errors.ts";

/**
 * A build that ran out of disk (or quota), as one line the user can act on:
 * what was being written, and how much is free there now that the build's
 * remains are gone. Found in gpulayer's own writes (the errno error, with the
 * path: core/atomic.ts adds it where the system call gives none), in the
 * words of an installer (which name the errno too, in any locale), and where
 * a build finds the disk full itself (NoSpaceLeft). Null for any other failure.
 */
export function diskFull(error: unknown, ctx: { home: string; envDir: string; step: string }): DiskFullError | null {
  let code = noSpaceCode(error);
  let path: string | null = null;
  let what: string;
  if (error instanceof NoSpaceLeft) {
    code = error.code;
    what = `the env (${error.doing})`;
  } else if (code) {
    path = (error as NodeJS.ErrnoException).path ?? null;
    what = path ? shown(path, ctx.home) : "gpulayer's files";
  } else if (error instanceof InstallError) {
    const lines = `${error.message}\n${error.detail}`.split("\n");
    let line: string | undefined;
    for (const c of ["ENOSPC", "EDQUOT"] as const) {
      line = lines.find((l) => NO_SPACE[c].said.test(l));
      if (line) {
        code = c;
        break;
      }
    }
    if (!code || !line) return null;
    path = lastPath(line);
    // "installing the requirements with uv failed: ...": the error names its step; the installer's file names are temporaries.
    const doing = /^(.+?) failed\b/.exec(error.message)?.[1] ?? ctx.step;
    what = !path || within(ctx.envDir, path) ? `the env (${doing})` : `${shown(path, ctx.home)} (${doing})`;
  } else return null;
  return new DiskFullError(`${NO_SPACE[code].words} while writing ${what}${freeThere(path ?? ctx.envDir, ctx.home)}`);
}

/** A build found the disk full where no system call said so (see build.ts, compileBytecode). */
export class NoSpaceLeft extends Error {
  constructor(
    readonly code: keyof typeof NO_SPACE,
    readonly doing: string,
  ) {
    super(`${NO_SPACE[code].words} while ${doing}`);
  }
}

/** Less than this free where a tool just wrote: it may have been cut short (a raw write that wrote part of its bytes). */
const NEARLY_FULL_BYTES = 64 * 1024;

/** Whether the filesystem holding `dir` has (next to) nothing left; false when that cannot be read. */
export function nearlyFull(dir: string): boolean {
  try {
    const s = statfsSync(dir);
    return Number(s.bavail) * Number(s.bsize) < NEARLY_FULL_BYTES;
  } catch {
    return false;
  }
}

/** Whether a tool's lines say it ran out of disk or quota. */
export function saysNoSpace(lines: string[]): boolean {
  return lines.some((l) => NO_SPACE.ENOSPC.said.test(l) || NO_SPACE.EDQUOT.said.test(l));
}

/** The last absolute path a line names: where the write that failed was going, in uv's and pip's wording. */
function lastPath(line: string): string | null {
  const found = [...line.matchAll(/(?:^|[\s'"`])(\/[^\s'"`:,()]+)/g)].map((m) => m[1]!);
  return found.at(-1) ?? null;
}

const within = (dir: string, path: string) => path === dir || path.startsWith(dir + sep);

const shown = (path: string, home: string) => (within(home, path) ? `$GPULAYER_HOME/${relative(home, path)}` : path);

/** ", N MiB free under GPULAYER_HOME" (or at the nearest folder that exists, elsewhere); nothing when it cannot be read. */
function freeThere(path: string, home: string): string {
  let dir = path;
  while (!existsSync(dir) && dirname(dir) !== dir) dir = dirname(dir);
  try {
    const s = statfsSync(dir);
    const mib = Math.floor((Number(s.bavail) * Number(s.bsize)) / 2 ** 20);
    return `, ${mib} MiB free ${within(home, dir) ? "under GPULAYER_HOME" : `at ${dir}`}`;
  } catch {
    return "";
  }
}
