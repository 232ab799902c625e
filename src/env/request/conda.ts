import { existsSync, readdirSync, readFileSync, realpathSync, statSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { contentHash } from "../../core/hashing.ts";
import { UsageError } from "../../errors.ts";
import { definedOnly } from "../../core/defined-env.ts";

export { condaActivation } from "./conda-activation.ts";

/**
 * Existing conda environments, found as conda finds them: a path is taken as
 * it is; a name is asked of conda when it is on PATH (`conda env list`), else
 * looked for where conda keeps environments (conda/base/context.py
 * `envs_dirs`, conda/core/envs_manager.py). What an environment holds is read
 * from its conda-meta/, the records conda writes at every install and removal.
 */

export interface CondaLookupContext {
  /** The process environment, passed in. */
  env: Record<string, string | undefined>;
  /** The user's home directory: `~` and the per-user places. */
  home: string;
  /** Relative paths resolve against this. */
  cwd: string;
}

export interface CondaEnv {
  /** Absolute, real path. */
  prefix: string;
  /** "base" for a root prefix, the folder name of an envs/<name>, else null (conda shows such an env by its path). */
  name: string | null;
  /** <prefix>/bin/python (or python3). */
  python: string;
  /** `name==version` of every conda-meta record, sorted. */
  packages: string[];
  /** sha256 over conda-meta's records and history: changes whenever conda installs or removes anything. */
  metaDigest: string;
}

export interface KnownCondaEnv {
  name: string | null;
  prefix: string;
  /** null when the environment has no Python. */
  python: string | null;
}

/**
 * Root prefixes that installers make when no variable names one, in the order
 * looked at (`~` is ctx.home). Variables come first: CONDA_ROOT,
 * MAMBA_ROOT_PREFIX, $CONDA_EXE's grand-parent, $CONDA_PREFIX's root.
 */
export const CONDA_DEFAULT_ROOTS: readonly string[] = ["~/miniconda3", "~/anaconda3", "~/miniforge3", "~/mambaforge", "~/micromamba", "/opt/conda", "/opt/miniconda3", "/opt/anaconda3", "/opt/miniforge3"];

/** conda starts slowly (a second or more, its plugins loaded); a hung one must not hang gpulayer. */
const CONDA_LIST_TIMEOUT_MS = 30_000;

const ENVIRONMENTS_TXT = [".conda", "environments.txt"];

function expandHome(path: string, home: string): string {
  if (path === "~") return home;
  return path.startsWith("~/") ? join(home, path.slice(2)) : path;
}

function realOrNull(path: string): string | null {
  try {
    return realpathSync(path);
  } catch {
    return null;
  }
}

function isDir(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

/** conda's own test (gateways/disk/test.py is_conda_environment). */
function isCondaPrefix(path: string): boolean {
  return isDir(join(path, "conda-meta"));
}

/** A path as the user knows it: the home directory as `~`. */
function shown(path: string, home: string): string {
  for (const h of new Set([home, realOrNull(home) ?? home])) {
    if (path === h) return "~";
    if (path.startsWith(`${h}/`)) return `~/${path.slice(h.length + 1)}`;
  }
  return path;
}

/** Existing folders among the paths, as real paths, each once, in order. */
function existingDirs(paths: (string | undefined)[], ctx: CondaLookupContext): string[] {
  const found: string[] = [];
  for (const p of paths) {
    if (!p) continue;
    const real = realOrNull(resolve(ctx.cwd, expandHome(p, ctx.home)));
    if (real && isDir(real) && !found.includes(real)) found.push(real);
  }
  return found;
}

/** The root prefixes that exist, those the environment names first. */
function condaRoots(ctx: CondaLookupContext): string[] {
  const { CONDA_ROOT, MAMBA_ROOT_PREFIX, CONDA_EXE, CONDA_PREFIX } = ctx.env;
  // An activated envs/<x> says where its root is; an activated root is named by CONDA_EXE already.
  const activeRoot = CONDA_PREFIX && basename(dirname(CONDA_PREFIX)) === "envs" ? dirname(dirname(CONDA_PREFIX)) : undefined;
  return existingDirs([CONDA_ROOT, MAMBA_ROOT_PREFIX, CONDA_EXE && dirname(dirname(CONDA_EXE)), activeRoot, ...CONDA_DEFAULT_ROOTS], ctx);
}

/** Where named environments live, as conda's `envs_dirs`: CONDA_ENVS_PATH (and its newer spelling) first. */
function envsDirs(ctx: CondaLookupContext, roots: string[]): string[] {
  const named = [ctx.env.CONDA_ENVS_PATH, ctx.env.CONDA_ENVS_DIRS].flatMap((v) => (v ?? "").split(":"));
  return existingDirs([...named, ...roots.map((r) => join(r, "envs")), join(ctx.home, ".conda", "envs")], ctx);
}

/** Prefixes conda registered in ~/.conda/environments.txt that are still conda environments (conda skips the rest too). */
function registeredPrefixes(ctx: CondaLookupContext): string[] {
  let text: string;
  try {
    text = readFileSync(join(ctx.home, ...ENVIRONMENTS_TXT), "utf8");
  } catch {
    return [];
  }
  const lines = text.split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
  return existingDirs(lines, ctx).filter(isCondaPrefix);
}

interface CondaAnswer {
  /** How the answer reads in a not-found message. */
  said: string;
  prefixes: string[];
  /** conda's own root prefix: where its executable lives (<root>/bin/conda, <root>/condabin/conda). */
  root: string | null;
}

/** `conda env list --json`, when conda is on PATH; a failure is an answer too (the folders are looked in then). */
function askConda(ctx: CondaLookupContext): CondaAnswer {
  const conda = Bun.which("conda", { PATH: ctx.env.PATH ?? "" });
  if (!conda) return { said: "conda not on PATH", prefixes: [], root: null };
  const failed = (why: string): CondaAnswer => ({ said: `conda env list (${why})`, prefixes: [], root: null });
  let proc: ReturnType<typeof Bun.spawnSync>;
  try {
    proc = Bun.spawnSync([conda, "env", "list", "--json"], { env: definedOnly(ctx.env), cwd: ctx.cwd, stdin: "ignore", stdout: "pipe", stderr: "pipe", timeout: CONDA_LIST_TIMEOUT_MS });
  } catch (error) {
    return failed(`cannot run ${shown(conda, ctx.home)}: ${(error as Error).message}`);
  }
  if (proc.exitedDueToTimeout) return failed(`no answer in ${CONDA_LIST_TIMEOUT_MS / 1000} s`);
  if (proc.exitCode !== 0) {
    const last = (proc.stderr ?? "").toString().trim().split("\n").pop()?.trim();
    return failed(last || `exit ${proc.exitCode ?? proc.signalCode}`);
  }
  let envs: unknown;
  try {
    envs = (JSON.parse((proc.stdout ?? "").toString()) as { envs?: unknown }).envs;
  } catch {
    return failed("not JSON");
  }
  if (!Array.isArray(envs)) return failed('no "envs" list');
  const prefixes = envs.filter((p): p is string => typeof p === "string").flatMap((p) => realOrNull(p) ?? []);
  return { said: "conda env list", prefixes, root: realOrNull(dirname(dirname(realOrNull(conda) ?? conda))) };
}

/** conda's name for a prefix (activate.py `_default_env`). */
function nameOf(prefix: string, roots: Set<string>): string | null {
  if (roots.has(prefix)) return "base";
  return basename(dirname(prefix)) === "envs" ? basename(prefix) : null;
}

function pythonOf(prefix: string): string | null {
  for (const program of ["python", "python3"]) {
    const path = join(prefix, "bin", program);
    if (existsSync(path)) return path;
  }
  return null;
}

/** The records' `name==version`, and a digest of every byte conda keeps there (an unreadable record by its name). */
function readMeta(prefix: string): { packages: string[]; metaDigest: string } {
  const meta = join(prefix, "conda-meta");
  const packages: string[] = [];
  const records: [string, string][] = [];
  for (const file of readdirSync(meta).filter((f) => f.endsWith(".json")).sort()) {
    let bytes: Buffer;
    try {
      bytes = readFileSync(join(meta, file));
    } catch {
      records.push([file, "unreadable"]);
      continue;
    }
    records.push([file, contentHash(bytes)]);
    try {
      const record = JSON.parse(bytes.toString("utf8")) as { name?: unknown; version?: unknown };
      if (typeof record.name === "string" && typeof record.version === "string") packages.push(`${record.name}==${record.version}`);
    } catch {
      // a malformed record names no package; its bytes are in the digest
    }
  }
  let history: string | null = null;
  try {
    history = contentHash(readFileSync(join(meta, "history")));
  } catch {
    // no history: an env made by hand, or copied without it
  }
  return { packages: packages.sort(), metaDigest: contentHash(JSON.stringify({ records, history })) };
}

function described(label: string, prefix: string, name: string | null, home: string): CondaEnv {
  const python = pythonOf(prefix);
  if (!python) throw new UsageError(`conda environment ${label} has no Python (${shown(join(prefix, "bin", "python"), home)})`);
  return { prefix, name, python, ...readMeta(prefix) };
}

/** An environment by name (conda's, then the folders') or by path (anything with a "/"). */
export function findCondaEnv(nameOrPath: string, ctx: CondaLookupContext): CondaEnv {
  if (nameOrPath.includes("/")) {
    const abs = resolve(ctx.cwd, expandHome(nameOrPath, ctx.home));
    if (!isDir(abs)) throw new UsageError(`${nameOrPath} is not a conda environment: no such folder ${shown(abs, ctx.home)}`);
    if (!isCondaPrefix(abs)) throw new UsageError(`${nameOrPath} is not a conda environment: no conda-meta in ${shown(abs, ctx.home)}`);
    const prefix = realpathSync(abs);
    return described(nameOrPath, prefix, nameOf(prefix, new Set(condaRoots(ctx))), ctx.home);
  }
  const name = nameOrPath;
  const conda = askConda(ctx);
  const roots = condaRoots(ctx);
  const rootSet = new Set(conda.root ? [conda.root, ...roots] : roots);
  const found = (prefix: string | undefined) => (prefix ? described(name, prefix, nameOf(prefix, rootSet), ctx.home) : null);

  // conda lists prefixes, not names: the root is "base", the others go by their folder's name, envs/<name> first.
  const listed = conda.prefixes.filter(isCondaPrefix);
  const sameName = listed.filter((p) => !rootSet.has(p) && basename(p) === name);
  const byConda = name === "base" ? listed.find((p) => rootSet.has(p)) : (sameName.find((p) => nameOf(p, rootSet) !== null) ?? sameName[0]);
  const fromConda = found(byConda);
  if (fromConda) return fromConda;

  const dirs = name === "base" ? roots : envsDirs(ctx, roots);
  const inDirs = name === "base" ? roots.find(isCondaPrefix) : dirs.map((d) => join(d, name)).find(isCondaPrefix);
  const fromDirs = found(inDirs && realpathSync(inDirs));
  if (fromDirs) return fromDirs;
  if (name !== "base") {
    const fromTxt = found(registeredPrefixes(ctx).find((p) => basename(p) === name));
    if (fromTxt) return fromTxt;
  }
  const looked = [conda.said, ...dirs.map((d) => shown(d, ctx.home)), `~/${ENVIRONMENTS_TXT.join("/")}`];
  throw new UsageError(`conda environment ${name} not found; looked in: ${looked.join(", ")}`.replace(/[\r\n]+/g, " "));
}

/** Every conda environment this machine knows of, conda's own answer first; each prefix once. */
export function listCondaEnvs(ctx: CondaLookupContext): KnownCondaEnv[] {
  const conda = askConda(ctx);
  const roots = condaRoots(ctx);
  const rootSet = new Set(conda.root ? [conda.root, ...roots] : roots);
  const known: KnownCondaEnv[] = [];
  const add = (path: string) => {
    const prefix = realOrNull(path);
    if (!prefix || !isCondaPrefix(prefix) || known.some((k) => k.prefix === prefix)) return;
    known.push({ name: nameOf(prefix, rootSet), prefix, python: pythonOf(prefix) });
  };
  conda.prefixes.forEach(add);
  roots.forEach(add);
  for (const dir of envsDirs(ctx, roots)) {
    let entries: string[] = [];
    try {
      entries = readdirSync(dir).sort();
    } catch {
      // unreadable (another user's envs dir): conda skips it too
    }
    for (const entry of entries) add(join(dir, entry));
  }
  registeredPrefixes(ctx).forEach(add);
  return known;
}
