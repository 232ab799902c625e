import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { explain } from "@renovatebot/pep440";
import type { InstallError } from "../../errors.ts";
import { type BuildPlan, flagFindLinks } from "./build-plan.ts";
import { NEUTRAL_VARIABLES, pipConfigFiles } from "../request/installer-config.ts";
import { type RequestFiles, requestFiles } from "./pip-path.ts";
import { normalizeName } from "../request/canonical.ts";
import { localPathOf, type Requirement } from "../request/requirements.ts";
import { type BuildHooks, installFailure, runTool } from "./run-tool.ts";
import type { UvTranslation } from "../request/pip-config.ts";
import { uvFailureMeaning } from "./uv-failure.ts";
import { MIRROR_MARK, type WorkerDist } from "./worker-mirror.ts";

/**
 * The fast path: uv installs, with the worker's distributions shown to it as
 * placeholders (worker-mirror.ts), so that it keeps what the worker has and
 * satisfies, and installs into the env (shadowing) what needs another
 * version, as pip does. Used only where it gives what pip gives; else pip.
 */

export const FAST_PATH = "uv (fast path)";

/** uv failed on a request the fast path took on, or chose what pip might not: under auto, pip builds it instead. */
export class UvFailed extends Error {
  constructor(
    readonly failure: InstallError,
    readonly reason: string,
  ) {
    super(failure.message);
  }
}

/** Which of the machine's pip settings pip would read when no index is given (names only: values may hold secrets). */
export function machinePipConfig(env: NodeJS.ProcessEnv): string[] {
  const vars = Object.keys(env).filter((k) => k.startsWith("PIP_") && env[k] !== undefined && !NEUTRAL_VARIABLES.has(k) && !(k === "PIP_CONFIG_FILE" && env[k] === "/dev/null"));
  return [...vars.sort(), ...pipConfigFiles(env).filter((f) => existsSync(f))];
}

/** Why the fast path cannot promise pip's result for this request, or null when it can. */
export function requestRefusal(plan: BuildPlan, uv: string | null): string | null {
  if (!uv) return "uv is not on PATH";
  // The machine's pip configuration is not a refusal by itself: what of it uv can honour, it is given (pip-config.ts).
  if (plan.inputs.uvDiffers) return plan.inputs.uvDiffers;
  // Which of a flag and a file's own -i wins is pip's rule; uv's may differ.
  if (plan.flags.indexUrl && plan.inputs.optionsSeen.has("--index-url")) return "--index-url given both as a flag and in a file is left to pip";
  if (flagFindLinks(plan).some((f) => f.includes("#"))) return "a --find-links path holding '#' is left to pip (uv reads it only up to the '#')";
  return null;
}

const WHEEL_FILE = /^([^-/]+)-([^-/]+)(-\d[^-/]*)?-[^-/]+-[^-/]+-[^-/]+\.whl$/i;

/**
 * A direct reference (path or URL) to something the worker already has: pip
 * keeps the worker's copy when the version is the same and the reference is a
 * wheel or a remote URL (resolver.py: "already installed with the same
 * version"), uv installs it again. Local folders, sdists and editables are
 * installed by both.
 */
export function workerRefusal(requirements: Requirement[], dists: WorkerDist[]): string | null {
  const have = new Map(dists.map((d) => [normalizeName(d.name), d.version]));
  for (const r of requirements) {
    if (r.install.startsWith("-e ")) continue;
    const at = r.name ? r.install.indexOf(" @ ") : -1;
    if (r.name && at === -1) continue; // a name and a specifier: uv and pip agree
    const target = (at === -1 ? r.install : r.install.slice(at + 3)).split(/\s+;\s*|\s+--/, 1)[0]!.trim();
    const isLocal = !/^[a-z][a-z0-9+.-]*:\/\//i.test(target) || /^file:/i.test(target);
    const file = basename(target.replace(/^file:(\/\/)?/i, "").split(/[?#]/, 1)[0]!);
    const wheel = WHEEL_FILE.exec(file);
    if (isLocal && !wheel) continue; // a local folder or sdist: both install it
    const name = r.name ?? (wheel ? normalizeName(wheel[1]!) : /[#&]egg=([A-Za-z0-9._-]+)/.exec(target)?.[1]);
    if (!name) return `a URL requirement whose name is known only once built (${r.origin}) is left to pip`;
    const workerVersion = have.get(normalizeName(name));
    if (workerVersion === undefined) continue;
    if (wheel && wheel[2] !== workerVersion) continue; // another version: both install it
    return `${r.origin} names ${name}, which the worker has (${workerVersion}); pip keeps the worker's copy of the same version, uv would not`;
  }
  return null;
}

/** uv's version: from the env's pyvenv.cfg when uv made it, else asked. */
export async function uvVersion(uv: string, envDir: string): Promise<string> {
  try {
    const m = /^uv\s*=\s*(\S+)/m.exec(readFileSync(join(envDir, "pyvenv.cfg"), "utf8"));
    if (m) return m[1]!;
  } catch {
    // not made by uv
  }
  const proc = Bun.spawn([uv, "--version"], { stdin: "ignore", stdout: "pipe", stderr: "ignore" });
  const out = await new Response(proc.stdout).text();
  await proc.exited;
  return out.trim().split(/\s+/)[1] ?? "?";
}

/**
 * uv's environment: never its own config (uv.toml, UV_* variables: none of it
 * is in the key), the same index options pip would get, as variables (so
 * credentials stay out of `ps`), and no colours or spinners in its lines.
 */
export function uvEnv(plan: BuildPlan, base: Record<string, string>, machine: UvTranslation | null = null): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(base)) if (!k.startsWith("UV_") || NEUTRAL_VARIABLES.has(k)) env[k] = v;
  // uv gives up on a cache lock after 300 s (another build of the same local project holds it) and the build would go to
  // pip from the start; waiting is right, and the prepare time limit still ends the wait.
  Object.assign(env, { NO_COLOR: "1", UV_NO_PROGRESS: "1", UV_INDEX_STRATEGY: "unsafe-best-match", UV_LOCK_TIMEOUT: "86400" }, machine?.env ?? {});
  const o = plan.flags;
  if (o.indexUrl) env.UV_INDEX_URL = o.indexUrl;
  if (o.extraIndexUrls.length) env.UV_EXTRA_INDEX_URL = o.extraIndexUrls.join(" ");
  // uv splits this variable at commas; a path with one goes on the command line instead (uvInstall).
  const links = flagFindLinks(plan);
  if (links.length && !links.some((f) => f.includes(","))) env.UV_FIND_LINKS = links.join(",");
  if (plan.offline) env.UV_OFFLINE = "1";
  return env;
}

/**
 * `uv pip install` into the env; a failure is UvFailed (uv's own words in it).
 * The bytecode is compiled after it (bytecode.ts), faster than uv's
 * --compile-bytecode, whose workers each import compileall first.
 */
export async function uvInstall(plan: BuildPlan, uv: string, envPython: string, env: Record<string, string>, hooks: BuildHooks, machine: UvTranslation | null = null, files: RequestFiles = requestFiles(plan.dir, plan.inputs, true)): Promise<void> {
  // --index-strategy unsafe-best-match: every index counts, as in pip (uv's default takes the first index that has a name).
  // The machine's pip settings come first: the request's own options, read later, win over them as in pip.
  const argv = [uv, "pip", "install", "--python", envPython, "--no-config", ...(machine?.args ?? []), ...files.args];
  // uv reuses its own build of a local project while the project's pyproject.toml/setup.py look unchanged
  // (its cache-keys); gpulayer's key has already seen a change elsewhere in it: build it afresh.
  if (plan.inputs.locals.some((l) => l.kind !== "archive")) argv.push("--refresh");
  // uv caches what a find-links folder offers by file name, as if it were an index's: a wheel rebuilt under the same
  // name would come from that cache. The key has seen the new content; uv is told to read each such project afresh.
  else for (const name of localFindLinksProjects(plan, machine)) argv.push("--refresh-package", name);
  if (!env.UV_FIND_LINKS) for (const f of flagFindLinks(plan)) argv.push("--find-links", f);
  // As the build's user, nothing of the env shares an inode with the user's cache, which its jobs can write.
  if (plan.user) argv.push("--link-mode", "copy");
  const { code, lines } = await runTool(argv, { env, cwd: plan.cwd, hooks, signal: plan.signal, keep: plan.keep, as: plan.user });
  files.done();
  if (code !== 0) {
    const meaning = uvFailureMeaning(lines, plan.cwd, files);
    if (meaning && "final" in meaning) throw meaning.final;
    if (meaning) throw new UvFailed(installFailure("installing the requirements with uv failed", files.named(lines)), meaning.retry);
    // The step that failed names itself: disk-full.ts reads "X failed".
    const failure = installFailure("installing the requirements with uv failed", files.named(lines));
    throw new UvFailed(failure, `uv failed: ${failure.message.replace(/^installing the requirements with uv failed:? ?/, "") || "(no message)"}`);
  }
}

/** A distribution file's project name (wheel or sdist, PEP 503 form), or null for anything else. */
function projectOfFile(file: string): string | null {
  const wheel = WHEEL_FILE.exec(file);
  if (wheel) return normalizeName(wheel[1]!);
  const sdist = /^(.+)-\d[^-]*\.(tar\.gz|tgz|zip|tar\.bz2|tar\.xz|tar)$/i.exec(file);
  return sdist ? normalizeName(sdist[1]!) : null;
}

/** The projects offered by local find-links locations: the request's files and flags, and the machine's pip configuration. */
export function localFindLinksProjects(plan: BuildPlan, machine: UvTranslation | null): string[] {
  const fromMachine = (machine?.args ?? []).flatMap((a, i, all) => (all[i - 1] === "--find-links" ? [a] : []));
  const paths = [...plan.inputs.findLinks.flatMap((f) => (f.path ? [f.path] : [])), ...flagFindLinks(plan), ...fromMachine].flatMap((f) => localPathOf(f) ?? []);
  const names = new Set<string>();
  for (const path of paths) {
    let files: string[];
    try {
      files = statSync(path).isDirectory() ? readdirSync(path) : [basename(path)];
    } catch {
      continue; // missing: pip warns and goes on, uv too
    }
    for (const f of files) {
      const name = projectOfFile(f);
      if (name) names.add(name);
    }
  }
  return [...names].sort();
}

/**
 * Pre-releases uv put into the env. Without --pre, uv takes one where nothing
 * else fits (`x>1` with only 2.0b1 above 1); pip takes one only when the
 * specifier names a pre-release or the name has no specifier and nothing else.
 * Rather than guess which, auto leaves such a request to pip.
 */
export function prereleasesInstalled(site: string, placeholders: string[] = []): string[] {
  // The worker's placeholders still in place are the worker's own: not parsed at all (hundreds, on a GPU worker).
  const skip = new Set(placeholders);
  return readdirSync(site).flatMap((n) => {
    if (skip.has(n)) return [];
    const m = /^(.+)-([^-]+)\.dist-info$/.exec(n);
    if (!m || !explain(m[2]!)?.is_prerelease) return [];
    try {
      if (readFileSync(join(site, n, "INSTALLER"), "utf8").trim() === MIRROR_MARK) return []; // the worker's own
    } catch {
      // no INSTALLER: not a placeholder
    }
    return [`${normalizeName(m[1]!)}==${m[2]}`];
  });
}

/** `uv pip check` while the placeholders are there: what pip check would say, the worker's packages included. */
export async function uvCheck(plan: BuildPlan, uv: string, envPython: string, env: Record<string, string>, hooks: BuildHooks): Promise<string[]> {
  const { code, lines } = await runTool([uv, "pip", "check", "--python", envPython, "--no-config"], { env, cwd: plan.cwd, hooks, signal: plan.signal, keep: plan.keep, as: plan.user });
  if (code === 0) return [];
  return lines.map((l) => l.trim()).filter((l) => l && !/^(Using Python|Checked \d+ package|Found \d+ incompatibilit|All installed packages are compatible)/.test(l));
}
