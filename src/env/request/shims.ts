import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, realpathSync, statSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { PythonProblem } from "../../errors.ts";
import { writeFileAtomic } from "../../core/atomic.ts";
import { contentHash } from "../../core/hashing.ts";
import { definedOnly } from "../../core/defined-env.ts";

/**
 * The interpreter that actually runs when a path is run. A pyenv shim (or any
 * script in front of Python) picks its Python anew at every start, from the
 * environment (PYENV_VERSION, .python-version files): its own file says
 * nothing. So a shim is resolved before anything is keyed or probed, and what
 * a shim answered is never cached as the interpreter's own answer (uv's rule).
 */

export interface ResolvedInterpreter {
  /** What runs: a real interpreter binary (or a venv's link to one). */
  path: string;
  /** How it was found, for `--dry-run` and `env show`: `pyenv shim (PYENV_VERSION=3.12.1)`. */
  via: string | null;
}

function firstBytes(path: string, n: number): Buffer {
  const fd = openSync(path, "r");
  try {
    const buf = Buffer.alloc(n);
    const got = readSync(fd, buf, 0, n, 0);
    return buf.subarray(0, got);
  } finally {
    closeSync(fd);
  }
}

/** pyenv's root, the versions it would try there, and what chose them. */
interface PyenvChoice {
  root: string;
  versions: string[];
  origin: string;
}

/** The versions pyenv would try, and what chose them (pyenv-version-name, pyenv-version-file). */
function pyenvVersions(env: Record<string, string | undefined>, cwd: string, root: string): { versions: string[]; origin: string } {
  if (env.PYENV_VERSION) return { versions: env.PYENV_VERSION.split(":").filter(Boolean), origin: `PYENV_VERSION=${env.PYENV_VERSION}` };
  const read = (file: string) =>
    readFileSync(file, "utf8")
      .split(/\s+/)
      .filter((w) => w && !w.startsWith("#"));
  for (let dir = env.PYENV_DIR || cwd; ; dir = dirname(dir)) {
    const file = join(dir, ".python-version");
    if (existsSync(file)) return { versions: read(file), origin: file };
    if (dirname(dir) === dir) break;
  }
  const global = join(root, "version");
  if (existsSync(global)) return { versions: read(global), origin: global };
  return { versions: ["system"], origin: "no version set" };
}

/**
 * A pyenv shim resolved as pyenv would; `absent` (with what chose the versions) when every version pyenv
 * would try is installed and lacks the program (the shim would say "command not found"); null where pyenv's
 * choice is not certain from files alone: "system", a path, or a version that is no folder of its own (a
 * prefix such as `uv init`'s "3.11", which pyenv takes as the latest 3.11.x it has, by its own rules).
 */
function resolvePyenvShim(path: string, text: string, env: Record<string, string | undefined>, cwd: string): ResolvedInterpreter | { absent: string } | { ask: PyenvChoice } | null {
  const root = /export PYENV_ROOT="([^"]+)"/.exec(text)?.[1] ?? env.PYENV_ROOT;
  if (!root) return null;
  const { versions, origin } = pyenvVersions(env, cwd, root);
  const program = basename(path);
  for (const v of versions) {
    if (v === "system" || v.includes("/")) return null;
    if (!existsSync(join(root, "versions", v))) return { ask: { root, versions, origin } };
    const candidate = join(root, "versions", v, "bin", program);
    if (existsSync(candidate)) return { path: candidate, via: `pyenv shim ${path} (${origin})` };
  }
  return versions.length ? { absent: origin } : null;
}

/** The program in the versions pyenv names (pyenvVersionNames); null where that does not settle it (system, none named, none has it). */
function resolveByPyenvNames(path: string, text: string, { root, versions, origin }: PyenvChoice, env: Record<string, string | undefined>, cwd: string, cacheDir: string): ResolvedInterpreter | null {
  const names = pyenvVersionNames(text, root, versions, env, cwd, cacheDir);
  for (const name of names ?? []) {
    if (name === "system" || name.includes("/")) return null;
    const candidate = join(root, "versions", name, "bin", basename(path));
    if (existsSync(candidate)) return { path: candidate, via: `pyenv shim ${path} (${origin}: pyenv version-name ${name})` };
  }
  return null;
}

/** pyenv's own answer (`pyenv which PROGRAM`) where its files alone do not say: the program's path, or why the shim has none. */
function pyenvWhich(text: string, program: string, env: Record<string, string | undefined>, cwd: string): string | { absent: string } | null {
  const pyenv = /exec "([^"]+)" exec /.exec(text)?.[1];
  if (!pyenv) return null;
  try {
    const r = Bun.spawnSync([pyenv, "which", program], { env: definedOnly(env), cwd, stdout: "pipe", stderr: "pipe" });
    const out = r.stdout.toString().trim();
    if (r.exitCode === 0 && out.startsWith("/")) return out;
    return { absent: `pyenv which ${program}: ${r.stderr.toString().trim().split("\n")[0] || `exit ${r.exitCode}`}` };
  } catch {
    return null;
  }
}

/** Ask a wrapper which Python it runs: the answer is used for this run only. */
function askWrapper(path: string, env: Record<string, string | undefined>, cwd: string): ResolvedInterpreter {
  const proc = Bun.spawnSync([path, "-c", "import sys; print(sys.executable)"], { env: definedOnly(env), cwd, stdout: "pipe", stderr: "pipe" });
  const out = (proc.stdout ?? "").toString().trim();
  if (proc.exitCode !== 0 || !out.startsWith("/")) {
    const msg = (proc.stderr ?? "").toString().trim().split("\n").pop() ?? "";
    throw new PythonProblem(`${path} is not a working Python 3 (${msg || `exit ${proc.exitCode}`})`);
  }
  return { path: out, via: `wrapper ${path} (asked: sys.executable)` };
}

/**
 * A tool behind a pyenv shim (uv installed with a pyenv Python's pip), resolved
 * as pyenv would, for this run only: the shim's bash costs tens of
 * milliseconds at every start. Anything else, or a shim whose choice is not
 * certain from files alone, is returned as it is.
 */
export function resolveToolShim(path: string, env: Record<string, string | undefined>, cwd: string): string | { absent: string } {
  try {
    if (firstBytes(realpathSync(path), 2).toString("latin1") !== "#!") return path;
    const text = readFileSync(path, "utf8").slice(0, 4096);
    if (!/pyenv"? exec/.test(text)) return path;
    const shim = resolvePyenvShim(path, text, env, cwd);
    if (shim && "ask" in shim) return pyenvWhich(text, basename(path), env, cwd) ?? path;
    if (!shim) return path;
    return "absent" in shim ? shim : shim.path;
  } catch {
    return path;
  }
}

/**
 * pyenv's own names for the versions it runs here (`pyenv version-name`, which resolves a prefix by its rules),
 * kept in `cacheDir` under all that decides them: the names chosen (read as pyenvVersions reads them), the
 * versions installed, and pyenv's own code. A warm prepare then costs a readdir, not a pyenv start. null where
 * pyenv gives no name (a version it does not have): the shim itself is asked.
 */
function pyenvVersionNames(text: string, root: string, chosen: string[], env: Record<string, string | undefined>, cwd: string, cacheDir: string): string[] | null {
  const pyenv = /exec "([^"]+)" exec /.exec(text)?.[1];
  if (!pyenv) return null;
  let installed: string[];
  try {
    installed = readdirSync(join(root, "versions")).sort();
  } catch {
    return null;
  }
  const rules = ["pyenv-version-name", "pyenv-latest"].map((f) => {
    const st = statSync(join(dirname(pyenv), f), { throwIfNoEntry: false });
    return st ? `${st.ino}:${st.size}:${st.mtimeMs}` : "-";
  });
  const file = join(cacheDir, `pyenv-names-${contentHash(JSON.stringify({ pyenv, root, chosen, installed, rules })).slice(0, 32)}.json`);
  try {
    const kept = JSON.parse(readFileSync(file, "utf8")) as { names?: unknown };
    if (Array.isArray(kept.names) && kept.names.every((n) => typeof n === "string")) return kept.names as string[];
  } catch {
    // not asked yet
  }
  try {
    const r = Bun.spawnSync([pyenv, "version-name"], { env: definedOnly(env), cwd, stdout: "pipe", stderr: "pipe" });
    const names = r.stdout.toString().trim().split(":").filter(Boolean);
    if (r.exitCode !== 0 || !names.length) return null;
    try {
      mkdirSync(cacheDir, { recursive: true });
      writeFileAtomic(file, JSON.stringify({ names }));
    } catch {
      // only saves the next run a pyenv start
    }
    return names;
  } catch {
    return null;
  }
}

/** Resolve shims and wrappers; a binary (or a link to one) is returned as it is. */
export function resolveInterpreter(path: string, env: Record<string, string | undefined>, cwd: string, cacheDir?: string): ResolvedInterpreter {
  let head: Buffer;
  try {
    head = firstBytes(realpathSync(path), 2);
  } catch (error) {
    throw new PythonProblem(`cannot read ${path}: ${(error as Error).message}`);
  }
  if (head.toString("latin1") !== "#!") return { path, via: null };
  let text = "";
  try {
    text = readFileSync(path, "utf8").slice(0, 4096);
  } catch {
    // unreadable script: ask it
  }
  if (/pyenv"? exec/.test(text)) {
    const shim = resolvePyenvShim(path, text, env, cwd);
    if (shim && "ask" in shim) {
      // A version pyenv resolves by its own rules: its names for it, kept; else the shim itself says which Python it runs, below.
      const byName = cacheDir ? resolveByPyenvNames(path, text, shim.ask, env, cwd, cacheDir) : null;
      if (byName) return byName;
    } else if (shim && "absent" in shim) throw new PythonProblem(`${path} is a pyenv shim, and the Python version pyenv picks here (${shim.absent}) has no ${basename(path)}`);
    else if (shim) return shim;
  }
  return askWrapper(path, env, cwd);
}
