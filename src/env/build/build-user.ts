import { chmodSync, lchownSync, lstatSync, mkdirSync } from "node:fs";
import { join, relative } from "node:path";
import { InstallError } from "../../errors.ts";
import type { RequestInputs } from "../request/requirements.ts";

/**
 * A build as another OS user (worker.run_as): every process that runs code
 * of what a job asks for (the installers, which run sdists' and local
 * projects' setup.py and PEP 517 backends, the bytecode compile, the checks,
 * which start the env's interpreter and so its .pth files) runs as that user
 * through setpriv, with caches of the user's own, and never sees the worker's
 * token, identity or job records. What runs no code of the job (making the
 * bare venv, reading the machine's pip configuration, the worker's own
 * scans) stays the worker's.
 *
 * The env is the worker's before the installers run and after: it is handed
 * over whole just before (core/tree-owner.ts giveTree), and taken back whole
 * once the user's last process of it has ended (reclaimTree): then it is
 * root's, readable by the user's group and by no one else, writable by none
 * of them, and only then does the worker write its meta and ready marker.
 */

export interface BuildUser {
  user: string;
  uid: number;
  gid: number;
  home: string;
}

/** A build's user, and where its caches live (`users/<uid>/cache` under the home: the user's, 0700). */
export interface BuildAs extends BuildUser {
  cacheDir: string;
}

/** The command line that starts `argv` as the build's user: its ids and groups, nothing of root's. */
export function buildUserArgv(u: BuildUser, argv: string[]): string[] {
  return ["setpriv", `--reuid=${u.uid}`, `--regid=${u.gid}`, "--init-groups", "--", ...argv];
}

/**
 * What the user's build processes get on top of the build's environment: its
 * name, its caches. HOME stays the worker's (what the key read the pip
 * configuration from; closed to the user, so it reads none of it), never the
 * user's own, where a job could leave a pip.conf for later builds.
 */
export function buildUserEnv(u: BuildAs): Record<string, string> {
  return {
    USER: u.user,
    LOGNAME: u.user,
    UV_CACHE_DIR: join(u.cacheDir, "uv"),
    PIP_CACHE_DIR: join(u.cacheDir, "pip"),
    XDG_CACHE_HOME: u.cacheDir,
  };
}

/** `<home>/users/<uid>/cache`, the user's own and closed to others (0700), made or put right. */
export function userCacheDir(users: string, u: BuildUser): string {
  mkdirSync(users, { recursive: true, mode: 0o711 });
  // Ours, and enterable by each user without listing the others.
  lchownSync(users, process.getuid?.() ?? 0, process.getgid?.() ?? 0);
  chmodSync(users, 0o711);
  const own = join(users, String(u.uid));
  const cache = join(own, "cache");
  mkdirSync(cache, { recursive: true, mode: 0o700 });
  for (const dir of [own, cache]) {
    if (!lstatSync(dir).isDirectory()) throw new InstallError(`${dir} is not a folder`, "");
    lchownSync(dir, u.uid, u.gid);
    chmodSync(dir, 0o700);
  }
  return cache;
}

/** A path under `from` (the request's folder the key read), at the same place under `to` (the user's copy of it). */
export function relocate(path: string, from: string, to: string): string {
  const rel = relative(from, path);
  return rel === "" ? to : rel.startsWith("..") || rel.startsWith("/") ? path : join(to, rel);
}

/**
 * The request's inputs with every path they hold at its place in the user's
 * copy (`moved`): the installers run as the user, who cannot read the
 * worker's copy the key was read from.
 */
export function relocateInputs(inputs: RequestInputs, moved: (path: string) => string): RequestInputs {
  return {
    ...inputs,
    ...(inputs.topFile ? { topFile: moved(inputs.topFile) } : {}),
    files: inputs.files.map((f) => ({ ...f, path: moved(f.path) })),
    locals: inputs.locals.map((l) => ({ ...l, path: moved(l.path) })),
    findLinks: inputs.findLinks.map((f) => (f.path ? { ...f, path: moved(f.path) } : f)),
    requirementsUnderConstraints: inputs.requirementsUnderConstraints.map(moved),
  };
}
