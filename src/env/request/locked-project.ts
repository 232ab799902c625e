import { existsSync, readFileSync, realpathSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { contentHash } from "../../core/hashing.ts";
import { normalizeName } from "./canonical.ts";
import { UsageError } from "../../errors.ts";
import { fileDigest } from "./content-digest.ts";
import { type RequestInputs, type ScanContext, confineTo, scanRequest } from "./requirements.ts";
import { treeDigest } from "./tree-digest.ts";

/**
 * A uv project (pyproject.toml + uv.lock) as a request's environment: what
 * the key holds of it (here, read on the warm path: no process, no TOML
 * parser); its build is build/locked-project.ts.
 *
 * The route: `uv sync --frozen --inexact` into gpulayer's own venv
 * (UV_PROJECT_ENVIRONMENT), while the worker's stand-ins are in its
 * site-packages as on the fast path (standins.ts). Not `uv export` into a
 * requirements file: sync is what the issue promises by definition (the
 * project installed as uv installs it, editable or not, the lock's hashes and
 * sources, groups and extras as uv reads them), where an export would have
 * gpulayer re-read uv's rules. --inexact keeps the stand-ins and the .pth
 * that links the worker. A stand-in is kept only when it is exactly the
 * locked version: uv's `==` ignores a local label (`2.1.0` holds for
 * `2.1.0+cu124`), so a stand-in of another version is taken out first, and
 * uv installs the locked one over the worker's (shadowed, and reported).
 */

export interface LockedProject {
  /** The project's folder (absolute): pyproject.toml and uv.lock are in it. */
  dir: string;
  groups: string[];
  extras: string[];
}

/** What the key holds of a project besides its local projects (which are scanned as any local project is). */
export interface LockedProjectKey {
  lock: string;
  pyproject: string;
  groups: string[];
  extras: string[];
}

/** A worker package the lock brings its own version of. */
export interface Shadowed {
  name: string;
  worker: string;
  locked: string;
}

// The lock's local sources (the project itself among them): `source = { editable = "." }`; read by pattern, not parsed, on the warm path.
const LOCAL_SOURCE = /^source = \{ (editable|directory|path) = "((?:[^"\\]|\\.)*)"/gm;

/** Why `--project DIR` names no project to install from (no folder, a file, no pyproject.toml, no uv.lock); null when it does. */
export function projectFolderProblem(dir: string): string | null {
  const st = statSync(dir, { throwIfNoEntry: false });
  if (st?.isFile()) return `--project ${dir}: a file; give the project's folder (${dirname(dir)})`;
  if (!st?.isDirectory()) return `--project ${dir}: no such folder`;
  if (!existsSync(join(dir, "pyproject.toml"))) return `--project ${dir}: no pyproject.toml in it`;
  if (!existsSync(join(dir, "uv.lock"))) {
    // A workspace's member: its lock is the workspace root's, and `uv lock` here would not make one.
    const root = lockAbove(dir);
    return root ? `--project ${dir}: no uv.lock in it; it is a member of the workspace at ${root}, whose uv.lock covers it: give --project ${root} (a member alone is not selected yet)` : `--project ${dir}: no uv.lock in it (run uv lock)`;
  }
  return null;
}

/** The nearest folder above `dir` that is a uv workspace's root with its lock, `dir` among its members (its `members` globs, not its `exclude`). */
function lockAbove(dir: string): string | null {
  for (let at = dirname(dir); at !== dirname(at); at = dirname(at)) {
    if (!existsSync(join(at, "uv.lock"))) continue;
    let workspace: { members?: unknown; exclude?: unknown } | undefined;
    try {
      workspace = (Bun.TOML.parse(readFileSync(join(at, "pyproject.toml"), "utf8")) as { tool?: { uv?: { workspace?: { members?: unknown; exclude?: unknown } } } }).tool?.uv?.workspace;
    } catch {
      continue; // no pyproject.toml there, or one uv could not read either: not a root to point to
    }
    const rel = relative(at, dir);
    const matches = (globs: unknown) => Array.isArray(globs) && globs.some((g) => typeof g === "string" && new Bun.Glob(g.replace(/\/+$/, "")).match(rel));
    if (workspace && matches(workspace.members) && !matches(workspace.exclude)) return at;
  }
  return null;
}

/**
 * The key's part of a project and the inputs its local projects make (their files, counted as today's local
 * projects are: an editable one by its place too). No process is started: a warm prepare stays a hash.
 */
export function lockedProjectInputs(project: LockedProject, ctx: ScanContext): { key: LockedProjectKey; inputs: RequestInputs } {
  const { dir } = project;
  if (ctx.confine) confineTo(ctx.confine, dir, "--project", "the project");
  const pyprojectPath = join(dir, "pyproject.toml");
  const lockPath = join(dir, "uv.lock");
  const problem = projectFolderProblem(dir);
  if (problem) throw new UsageError(problem);
  const lock = readFileSync(lockPath, "utf8");
  const inputs = scanRequest({ specs: [] }, ctx);
  // The local projects as a requirements list's are counted (requirements.ts): an editable one by its files and place, another by its files, a file by its bytes.
  const sources = [...lock.matchAll(LOCAL_SOURCE)].map((m) => ({ kind: m[1] === "editable" ? ("editable" as const) : ("project" as const), path: resolve(dir, JSON.parse(`"${m[2]}"`) as string), origin: `${lockPath}: ${m[1]} = ${m[2]}` }));
  countLocalSources(inputs, sources, "uv.lock", ctx);
  const key = { lock: contentHash(lock), pyproject: contentHash(readFileSync(pyprojectPath)), groups: selected(project.groups), extras: selected(project.extras) };
  return { key, inputs };
}


/** A lock's local sources counted into the inputs as a requirements list's local projects are: an editable one by its files and place, another by its files, a file by its bytes. */
export function countLocalSources(inputs: RequestInputs, sources: { kind: "editable" | "project"; path: string; origin: string }[], lockName: string, ctx: ScanContext): void {
  const seen = new Set<string>();
  for (const { kind, path, origin } of sources) {
    if (seen.has(path)) continue;
    seen.add(path);
    if (ctx.confine) confineTo(ctx.confine, path, lockName, "the local project");
    const st = statSync(path, { throwIfNoEntry: false });
    if (!st) throw new UsageError(`${origin}: not found (looked for ${path})`);
    if (st.isDirectory()) {
      const editable = kind === "editable";
      const tree = treeDigest(realpathSync(path), { editable, cacheDir: ctx.digestCache, onHashing: ctx.onHashing });
      inputs.locals.push({ kind: editable ? "editable" : "project", path, digest: tree.digest, origin, files: tree.files });
    } else inputs.locals.push({ kind: "archive", path, digest: fileDigest(path, ctx.digestCache, ctx.onHashing), origin });
  }
}

/** Groups or extras as uv takes them: names normalised (PEP 735 and 685: `DEV`, `Dev_Tools` are `dev`, `dev-tools`), each once, sorted. */
function selected(names: string[]): string[] {
  return [...new Set(names.map(normalizeName))].sort();
}

/** The project's own name ([project] name), else its folder's: a worker holds it in a folder named by its bundle. */
function projectName(dir: string): string {
  try {
    const name = (Bun.TOML.parse(readFileSync(join(dir, "pyproject.toml"), "utf8")) as { project?: { name?: unknown } }).project?.name;
    if (typeof name === "string" && name) return name;
  } catch {
    // a pyproject.toml uv cannot read either: the lock check says so
  }
  return dir.split("/").pop() ?? dir;
}

/** How a project's env is named in reports: `uv project app (uv.lock --group tools --extra fancy)`. */
export function projectSummary(project: LockedProject): string {
  return `uv project ${projectName(project.dir)} (uv.lock${[...project.groups.map((g) => ` --group ${g}`), ...project.extras.map((e) => ` --extra ${e}`)].join("")})`;
}

/** The local packages a project's lock installs (the project itself, when it is a package), by path; none when there is no lock to read. */
/** The names of the lock's local packages (each `[[package]]` whose source is a folder or path on this disk): what a build gets afresh. */
export function lockLocalPackages(dir: string): string[] {
  let lock: string;
  try {
    lock = readFileSync(join(dir, "uv.lock"), "utf8");
  } catch {
    return []; // unreadable: uv says why, in the sync itself
  }
  return lock
    .split(/^\[\[package\]\]$/m)
    .filter((block) => new RegExp(LOCAL_SOURCE.source, "m").test(block))
    .map((block) => /^name = "([^"]+)"/m.exec(block)?.[1])
    .filter((name): name is string => name !== undefined);
}

export function lockLocalSources(dir: string): string[] {
  let lock: string;
  try {
    lock = readFileSync(join(dir, "uv.lock"), "utf8");
  } catch {
    return [];
  }
  return [...new Set([...lock.matchAll(LOCAL_SOURCE)].map((m) => resolve(dir, JSON.parse(`"${m[2]}"`) as string)))];
}
