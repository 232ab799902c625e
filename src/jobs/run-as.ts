import { chmodSync, mkdirSync } from "node:fs";
import { giveTree as giveTreeTo } from "../core/tree-owner.ts";
import { UsageError } from "../errors.ts";

/**
 * Jobs as another OS user (worker.run_as): the worker, as root, keeps its
 * token, credential and home to itself; each job runs through `setpriv`
 * (util-linux) as the user, and so does the build of its env
 * (env/build-user.ts); the user can read the envs but not write them, and
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

/** A job's workdir is the user's: it writes there (and its env's build reads it: env/build-user.ts). Links are not followed. */
export function giveTree(dir: string, r: RunAs): void {
  giveTreeTo(dir, r.uid, r.gid);
}

interface Checks {
  env: Record<string, string>;
  /** Folders the user must enter and read: the env store, the job workdirs. */
  reachable: string[];
  /** The worker's own folders (other jobs' records and bundles, its identity): closed to others here (0700). */
  closed: string[];
  /** Files and folders the user must not read: those, and the token file. */
  secret: string[];
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
    mkdirSync(dir, { recursive: true });
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
