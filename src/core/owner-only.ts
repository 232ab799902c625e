import { chmodSync, lstatSync, mkdirSync, readdirSync, type Stats } from "node:fs";
import { join } from "node:path";

/**
 * What gpulayer writes under a home is its user's alone (0700 folders, 0600
 * files), whatever umask it was started with: the CLI closes its umask to 077
 * first thing, so every file it, SQLite and the installers it starts create
 * is owner-only. Jobs' records, logs, the server's database and its WAL hold
 * environment values and output other local users must not read.
 *
 * Two things are opened on purpose:
 * - a job's command runs with the umask gpulayer was started with (what it
 *   writes is the job's, not gpulayer's): `withUmask`;
 * - an env, once built or fetched, is readable by all (`openToReaders`): it
 *   holds code, never a secret, and a `--run-as` job user must run it. The
 *   home root stays closed, so that opens nothing until a `--run-as` worker
 *   opens the path to the env store (see jobs/run-as.ts).
 */

let launched: number | undefined;

/** Called once, at the CLI's top: from here on everything is created owner-only. */
export function closeUmask(): void {
  launched ??= process.umask(0o077);
}

/** The umask gpulayer was started with (undefined where closeUmask never ran: nothing to restore). */
export function launchUmask(): number | undefined {
  return launched;
}

/** `argv` started with `mask` as its umask: sh sets it and execs argv (same process; its command line becomes argv's). */
export function withUmask(argv: string[], mask: number | undefined): string[] {
  if (mask === undefined || mask === 0o077) return argv;
  return ["/bin/sh", "-c", `umask ${mask.toString(8).padStart(4, "0")} && exec "$0" "$@"`, ...argv];
}

/**
 * A folder made (with its parents) and closed to 0700, as an older gpulayer's
 * may have been made 0755: closing the folder closes the files in it, whatever
 * their own modes. A folder of another owner (a reader's look at someone
 * else's home) is left as it is.
 */
export function ownerOnlyFolder(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  try {
    chmodSync(dir, 0o700);
  } catch {
    // EPERM: not ours to close.
  }
}

/**
 * Every folder and file under `dir` readable by all (folders and executables
 * enterable too), as a 022 umask would have made them. Links are never
 * followed: an env links to its worker's Python, which is not ours to change.
 * `seen` gets each entry's lstat (links too), so one walk can also measure.
 */
export function openToReaders(dir: string, seen?: (st: Stats) => void): void {
  const walk = (path: string) => {
    const st = lstatSync(path);
    seen?.(st);
    if (st.isSymbolicLink()) return;
    const isDir = st.isDirectory();
    const wanted = st.mode & 0o7777 | (isDir || st.mode & 0o100 ? 0o055 : 0o044);
    if (wanted !== (st.mode & 0o7777)) chmodSync(path, wanted);
    if (isDir) for (const name of readdirSync(path)) walk(join(path, name));
  };
  walk(dir);
}
