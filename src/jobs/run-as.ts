import { chmodSync, lstatSync, mkdirSync, readdirSync, realpathSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { giveTree as giveTreeTo } from "../core/tree-owner.ts";
import { UsageError } from "../errors.ts";

/**
 * Jobs as another OS user (worker.run_as): the worker, as root, keeps its
 * token, credential and home to itself; each job runs through `setpriv`
 * (util-linux) as the user, and so does the build of its env
 * (env/build/build-user.ts); the user can read the envs but not write them, and
 * cannot read the worker's secrets or its process's environment.
 * Everything is checked when the worker starts, as that user, by asking the
 * kernel (`test -r`, `test -x` run as the user), so a home under a closed
 * folder or a token file others may read stops the worker with one line
 * rather than surfacing as a failed job later.
 */

export interface RunAs {
  user: string;
  uid: number;
  gid: number;
  home: string;
}

/** The command line that starts `argv` as the user: real and effective ids, the user's groups, nothing of root's. */
export function runAsArgv(r: RunAs, argv: string[]): string[] {
  return ["setpriv", `--reuid=${r.uid}`, `--regid=${r.gid}`, "--init-groups", "--", ...argv];
}

/**
 * How a job's command starts: through setpriv where there is one, with a
 * parent-death signal, so the job's main process dies with whatever runs it
 * (a SIGKILLed worker or `job run` leaves no job running unwatched), and as
 * worker.run_as's user when set.
 */
export function jobArgv(argv: string[], setpriv: string | null, runAs?: RunAs): string[] {
  if (!setpriv) return argv;
  const user = runAs ? [`--reuid=${runAs.uid}`, `--regid=${runAs.gid}`, "--init-groups"] : [];
  return [setpriv, ...user, "--pdeathsig=KILL", "--", ...argv];
}

/** The job's own variables that name who it is. */
export function runAsEnv(r: RunAs): Record<string, string> {
  return { HOME: r.home, USER: r.user, LOGNAME: r.user };
}

/** A job's workdir is the user's: it writes there (and its env's build reads it: env/build/build-user.ts). Links are not followed. */
export function giveTree(dir: string, r: RunAs): void {
  giveTreeTo(dir, r.uid, r.gid);
}

interface Checks {
  env: Record<string, string>;
  /** The worker's home: made 0700 by gpulayer's umask, opened here only as far as `reachable` needs. */
  home: string;
  /** Folders under the home the user must enter and read: the env store, the job workdirs. */
  reachable: string[];
  /** The worker's own folders (other jobs' records and bundles, its identity): closed to others here (0700). */
  closed: string[];
  /** Files and folders the user must not read: those, and the token file. */
  secret: string[];
}

/**
 * `dir` made readable by all (0755), and every folder above it up to the home
 * enterable, not listable (0711): everything else under the home stays 0700,
 * as gpulayer's umask made it. Folders above the home are not the worker's to
 * open: the check after names one the user cannot enter.
 */
function openPathTo(home: string, dir: string): void {
  mkdirSync(dir, { recursive: true });
  chmodSync(dir, 0o755);
  for (let above = dirname(dir); above.startsWith(home) && above !== dirname(above); above = dirname(above)) {
    // Not listable, whatever an older gpulayer's 022 made it: USER enters by name only.
    chmodSync(above, (statSync(above).mode & 0o7700) | 0o011);
    if (above === home) break;
  }
}

/** As the user: does `test ARGS` hold? */
function asUser(r: RunAs, env: Record<string, string>, test: string[]): boolean {
  return Bun.spawnSync(runAsArgv(r, ["test", ...test]), { env, stdout: "ignore", stderr: "ignore" }).exitCode === 0;
}

export function resolveRunAs(name: string, isRoot: boolean, checks: Checks): RunAs {
  const what = `worker.run_as ${name}`;
  if (!isRoot) throw new UsageError(`${what}: the worker must run as root to start jobs as another user (or leave run_as out: jobs then run as the worker's own user)`);
  if (!Bun.which("setpriv", { PATH: checks.env.PATH ?? "/usr/bin:/bin" })) throw new UsageError(`${what}: needs setpriv (util-linux) on PATH`);
  const entry = Bun.spawnSync(["getent", "passwd", name], { env: checks.env, stdout: "pipe", stderr: "ignore" });
  const fields = entry.exitCode === 0 ? entry.stdout.toString().trim().split("\n")[0]!.split(":") : [];
  if (fields.length < 7) throw new UsageError(`${what}: no such user on this machine (getent passwd ${name})`);
  const r: RunAs = { user: fields[0]!, uid: Number(fields[2]), gid: Number(fields[3]), home: fields[5]! };
  if (r.uid === 0) throw new UsageError(`${what}: that is root, the worker's own user; name an unprivileged user`);
  for (const dir of checks.reachable) {
    openPathTo(checks.home, dir);
    if (!asUser(r, checks.env, ["-x", dir, "-a", "-r", dir])) throw new UsageError(`${what}: ${r.user} cannot reach ${dir} (a folder above it is closed to others, as /root is); give the worker a GPULAYER_HOME others can enter, like /var/lib/gpulayer`);
  }
  for (const dir of checks.closed) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    chmodSync(dir, 0o700);
  }
  for (const path of [...checks.closed, ...checks.secret]) {
    if (asUser(r, checks.env, ["-r", path])) throw new UsageError(`${what}: ${r.user}, who runs the jobs, can read ${path}; make it readable by the worker alone (chmod 600, or 700 for a folder)`);
  }
  return r;
}

/**
 * The worker's Python as the user runs it: every folder on its path (and on
 * the path it links to) enterable, the program executable, and a start that
 * works. Otherwise a job's `python` would fail, or quietly be another one
 * found later on PATH; the worker refuses to start, naming what is closed.
 */
export function refuseUnrunnablePython(r: RunAs, python: string, env: Record<string, string>): void {
  const what = `worker.run_as ${r.user}`;
  let real = python;
  try {
    real = realpathSync(python);
  } catch {
    // Checked as the user below: its own error names it.
  }
  const folders = [...new Set([...foldersAbove(python), ...foldersAbove(real)])];
  // One start for all of them: the first folder the user cannot enter.
  const walk = Bun.spawnSync(runAsArgv(r, ["sh", "-c", 'for d; do test -x "$d" || { printf %s "$d"; exit 1; }; done', "sh", ...folders]), { env, stdout: "pipe", stderr: "ignore" });
  if (walk.exitCode !== 0) {
    const closed = walk.stdout.toString() || folders[0];
    throw new UsageError(`${what}: ${r.user} cannot enter ${closed}, on the way to the worker's Python ${python}; jobs would not run it. Give --python a Python ${r.user} can run (chmod o+x ${closed}, or one outside it)`);
  }
  if (!asUser(r, env, ["-x", python])) throw new UsageError(`${what}: ${r.user} cannot execute the worker's Python ${python}; give --python a Python ${r.user} can run`);
  const start = Bun.spawnSync(runAsArgv(r, [python, "-I", "-c", "import sys"]), { env, cwd: "/", stdout: "ignore", stderr: "pipe" });
  if (start.exitCode !== 0) {
    const said = start.stderr.toString().trim().split("\n").at(-1) ?? "";
    throw new UsageError(`${what}: ${r.user} cannot run the worker's Python ${python} (${said || `exit ${start.exitCode}`}); give --python a Python ${r.user} can run`);
  }
}

/** /, /a, /a/b for /a/b/python: the folders one must enter to reach it. */
function foldersAbove(path: string): string[] {
  const out: string[] = [];
  for (let d = dirname(path); ; d = dirname(d)) {
    out.unshift(d);
    if (d === dirname(d)) return out;
  }
}
