import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { explain } from "@renovatebot/pep440";
import { UsageError } from "../../errors.ts";
import { normalizeName } from "../request/canonical.ts";
import { distributions } from "../request/interpreter.ts";
import { giveTree } from "../../core/tree-owner.ts";
import { type LockedProject, lockLocalPackages, type Shadowed } from "../request/locked-project.ts";
import { type BuildHooks, installFailure, runTool } from "./run-tool.ts";
import { placeholderDir, type WorkerDist, writePlaceholders } from "./worker-mirror.ts";

/** A uv project's build (the route: request/locked-project.ts): the lock checked, uv sync into the env, what it shadows. */

/** Every package the lock pins: normalised name to its versions (one, unless the lock forks by marker). */
export function lockedVersions(dir: string): Map<string, string[]> {
  const doc = Bun.TOML.parse(readFileSync(join(dir, "uv.lock"), "utf8")) as { package?: { name: string; version?: string }[] };
  const out = new Map<string, string[]>();
  for (const p of doc.package ?? []) {
    if (!p.version) continue;
    const name = normalizeName(p.name);
    out.set(name, [...(out.get(name) ?? []), p.version]);
  }
  return out;
}

/** Two versions the same, local label included (`2.1.0` is not `2.1.0+cu124`); trailing zeros of the release aside. */
export function sameVersion(a: string, b: string): boolean {
  const form = (v: string) => {
    const e = explain(v);
    if (!e) return v.trim().toLowerCase();
    const release = [...e.release];
    while (release.length > 1 && release.at(-1) === 0) release.pop();
    return JSON.stringify({ ...e, release, public: undefined, base_version: undefined, is_prerelease: undefined, is_devrelease: undefined, is_postrelease: undefined });
  };
  return form(a) === form(b);
}

/**
 * Take out of site-packages the stand-ins of worker packages the lock pins at another version, so that uv
 * installs the locked one (uv would keep `2.1.0+cu124` for a lock's `2.1.0`). Returns them by name, with the locked version.
 */
export function dropMislockedStandins(site: string, dists: WorkerDist[], locked: Map<string, string[]>): Map<string, string> {
  const taken = new Map<string, string>();
  for (const d of dists) {
    const versions = locked.get(normalizeName(d.name));
    if (!versions || versions.some((v) => sameVersion(v, d.version))) continue;
    rmSync(join(site, placeholderDir(d)), { recursive: true, force: true });
    taken.set(normalizeName(d.name), versions.join(" | "));
  }
  return taken;
}

/**
 * After uv: the stand-ins taken out for a package the selection does not install (a lock names every group's and
 * extra's packages) go back, so the env's check sees the worker's package that its jobs import.
 */
export async function restoreUninstalled(site: string, dists: WorkerDist[], taken: Map<string, string>, as?: { uid: number; gid: number }): Promise<void> {
  const installed = new Set(distributions([site]).map((d) => d.name));
  const back = dists.filter((d) => taken.has(normalizeName(d.name)) && !installed.has(normalizeName(d.name)));
  for (const d of back) taken.delete(normalizeName(d.name));
  if (!back.length) return;
  await writePlaceholders(site, back);
  // A build as another user (worker.run_as) checks the env as that user: its stand-ins are that user's, as the rest of the env is.
  if (as) for (const d of back) giveTree(join(site, placeholderDir(d)), as.uid, as.gid);
}

/** The worker packages the env now holds its own version of: taken out, and installed by uv. */
export function shadowedBy(dists: WorkerDist[], taken: Map<string, string>, replaced: WorkerDist[], added: string[]): Shadowed[] {
  const installed = new Set(added);
  const gone = new Set(replaced.map((d) => normalizeName(d.name)));
  return dists
    .filter((d) => gone.has(normalizeName(d.name)) && installed.has(normalizeName(d.name)))
    .map((d) => ({ name: normalizeName(d.name), worker: d.version, locked: taken.get(normalizeName(d.name)) ?? "?" }))
    .sort((a, b) => (a.name < b.name ? -1 : 1));
}

export interface UvRun {
  uv: string;
  env: Record<string, string>;
  cwd: string;
  hooks: BuildHooks;
  signal?: AbortSignal;
  keep?: import("./run-tool.ts").KeepGroup;
  as?: import("./build-user.ts").BuildAs;
}

/**
 * uv's environment for a project: its settings only from the project (its pyproject.toml's [tool.uv], in the key),
 * never the machine's UV_ variables or the user's uv.toml. Not --no-config: that would drop the project's own
 * [[tool.uv.index]] too, and `uv lock --check` would judge the lock against PyPI.
 */
export function projectUvEnv(base: Record<string, string>, envDir: string, noConfigDir: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(base)) if (!k.startsWith("UV_")) env[k] = v;
  // UV_CACHE_DIR is gpulayer's own choice (uv-cache.ts), not the machine's.
  if (base.UV_CACHE_DIR) env.UV_CACHE_DIR = base.UV_CACHE_DIR;
  return { ...env, NO_COLOR: "1", UV_NO_PROGRESS: "1", UV_PYTHON_DOWNLOADS: "never", UV_LOCK_TIMEOUT: "86400", UV_PROJECT_ENVIRONMENT: envDir, XDG_CONFIG_HOME: noConfigDir, XDG_CONFIG_DIRS: noConfigDir };
}

const selection = (p: LockedProject) => [...p.groups.flatMap((g) => ["--group", g]), ...p.extras.flatMap((e) => ["--extra", e])];

/**
 * How long a check without a build may take: `uv lock --check` of a project whose metadata must be built can
 * wait on an index that never answers; past this the check says nothing (a build checks again, with its time limit).
 */
const CHECK_NOW_MS = 15_000;

/**
 * The same check for `--dry-run` and for a client before it sends a project to a server, which build no env: with
 * the uv a build would find on PATH (none there: no check, they say what they can), within CHECK_NOW_MS. A stale
 * lock is refused as the build refuses it.
 */
export function checkLockNow(project: LockedProject, python: string, uv: string | null, base: Record<string, string>): void {
  if (!uv) return;
  const noConfig = mkdtempSync(join(tmpdir(), "gpulayer-lock-check-"));
  try {
    const env = projectUvEnv(base, join(noConfig, "env"), noConfig);
    const r = Bun.spawnSync([uv, "lock", "--check", "--project", project.dir, "--python", python], { env, cwd: project.dir, stdout: "pipe", stderr: "pipe", timeout: CHECK_NOW_MS });
    if (r.exitCode !== 0 && /needs to be updated/.test(`${r.stderr}${r.stdout}`)) throw new UsageError(`${project.dir}/uv.lock: the lockfile needs to be updated: run uv lock`);
    if (!project.groups.length && !project.extras.length) return;
    const asked = Bun.spawnSync([uv, "export", "--frozen", "--quiet", "--project", project.dir, "--python", python, ...selection(project), "-o", "/dev/null"], { env, cwd: project.dir, stdout: "pipe", stderr: "pipe", timeout: CHECK_NOW_MS });
    const undefinedName = asked.exitCode === 0 ? null : unknownSelection(`${asked.stderr}`.split("\n"));
    if (undefinedName) throw new UsageError(`${project.dir}: ${undefinedName}`);
  } finally {
    rmSync(noConfig, { recursive: true, force: true });
  }
}

/** `uv lock --check`: a lock that pyproject.toml has moved away from is refused in one line, as `uv sync --locked` refuses it. */
export async function checkLock(project: LockedProject, python: string, run: UvRun): Promise<void> {
  const tool = { env: run.env, cwd: run.cwd, hooks: {}, signal: run.signal, keep: run.keep, as: run.as };
  const { code, lines } = await runTool([run.uv, "lock", "--check", "--project", project.dir, "--python", python], tool);
  if (code !== 0) {
    if (lines.some((l) => /needs to be updated/.test(l))) throw new UsageError(`${project.dir}/uv.lock: the lockfile needs to be updated: run uv lock`);
    throw installFailure(`checking ${project.dir}/uv.lock with uv lock --check failed`, lines);
  }
  if (!project.groups.length && !project.extras.length) return;
  // The selection as uv reads it (uv export checks it as uv sync does): a group or extra the project lacks is refused before anything is built.
  const asked = await runTool([run.uv, "export", "--frozen", "--quiet", "--project", project.dir, "--python", python, ...selection(project), "-o", "/dev/null"], tool);
  const undefinedName = unknownSelection(asked.lines);
  if (undefinedName) throw new UsageError(`${project.dir}: ${undefinedName}`);
}

/** uv's own line for a group or extra the project does not define, if that is what it said. */
function unknownSelection(lines: string[]): string | null {
  const line = lines.find((l) => /(Group|Extra) `[^`]*` is not defined/.test(l));
  return line ? line.replace(/^error: /, "") : null;
}

/**
 * `uv sync --frozen --inexact` into the env: exactly the lock's selection, the stand-ins kept where they are the locked
 * version. The lock's local packages are built afresh (--refresh-package): uv's cache knows a path dependency by its
 * pyproject.toml, so a changed module would come back as it was, in an env whose key has seen the change.
 */
export async function syncProject(project: LockedProject, envPython: string, run: UvRun): Promise<void> {
  const fresh = lockLocalPackages(project.dir).flatMap((name) => ["--refresh-package", name]);
  const argv = [run.uv, "sync", "--frozen", "--inexact", "--project", project.dir, "--python", envPython, ...selection(project), ...fresh];
  const { code, lines } = await runTool(argv, { env: run.env, cwd: run.cwd, hooks: run.hooks, signal: run.signal, keep: run.keep, as: run.as });
  if (code !== 0) throw installFailure("installing the locked project with uv sync failed", lines);
}

/** Every package a pylock.toml pins: normalised name to its versions (a local package may have none). */
export function pylockVersions(file: string): Map<string, string[]> {
  const doc = Bun.TOML.parse(readFileSync(file, "utf8")) as { packages?: { name: string; version?: string }[] };
  const out = new Map<string, string[]>();
  for (const p of doc.packages ?? []) {
    if (!p.version) continue;
    const name = normalizeName(p.name);
    out.set(name, [...(out.get(name) ?? []), p.version]);
  }
  return out;
}

/**
 * `uv pip install -r pylock.toml` into the env: the file's packages, exactly (the lock is the resolution; uv
 * fetches what it names, by its URLs and hashes). The stand-ins the lock pins at another version are already out.
 */
export async function installPylock(file: string, envPython: string, run: UvRun & { refresh: boolean }): Promise<void> {
  // --refresh: a local package in the lock is built afresh (the key has seen its files), not taken from uv's cache.
  const argv = [run.uv, "pip", "install", "--python", envPython, "--no-config", "-r", file, ...(run.refresh ? ["--refresh"] : [])];
  const { code, lines } = await runTool(argv, { env: run.env, cwd: run.cwd, hooks: run.hooks, signal: run.signal, keep: run.keep, as: run.as });
  if (code !== 0) throw installFailure(`installing ${file} with uv pip install failed`, lines);
}

/**
 * The lock's selection for a build by another Python (an image's): `uv export --locked` writes it as a requirements
 * list of exact pins with their hashes, installed there with --no-deps --require-hashes. --locked refuses a stale
 * lock in the words checkLock uses. The project's own local packages are not in it (the image route refuses them).
 */
export async function exportLock(project: LockedProject, file: string, run: UvRun): Promise<void> {
  const argv = [run.uv, "export", "--locked", "--format", "requirements.txt", "--no-header", "--no-annotate", "--no-emit-project", "--project", project.dir, ...selection(project), "-o", file];
  const { code, lines } = await runTool(argv, { env: run.env, cwd: run.cwd, hooks: run.hooks, signal: run.signal, keep: run.keep, as: run.as });
  if (code === 0) return;
  if (lines.some((l) => /needs to be updated/.test(l))) throw new UsageError(`${project.dir}/uv.lock: the lockfile needs to be updated: run uv lock`);
  const undefinedName = unknownSelection(lines);
  if (undefinedName) throw new UsageError(`${project.dir}: ${undefinedName}`);
  throw installFailure(`reading ${project.dir}/uv.lock with uv export failed`, lines);
}

/** The indexes the lock's packages come from (its `registry` sources): a URL, or a folder (a file:// index) by its absolute path. */
export function lockRegistries(dir: string): string[] {
  const doc = Bun.TOML.parse(readFileSync(join(dir, "uv.lock"), "utf8")) as { package?: { source?: { registry?: string } }[] };
  const found = new Set<string>();
  for (const p of doc.package ?? []) {
    const at = p.source?.registry;
    if (at) found.add(/^[a-z][a-z0-9+.-]*:\/\//i.test(at) ? at : resolve(dir, at));
  }
  return [...found];
}
