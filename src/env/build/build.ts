import { existsSync, lchownSync, lstatSync } from "node:fs";
import { join } from "node:path";
import { InstallError, UsageError } from "../../errors.ts";
import { type BuildPlan, flagFindLinks } from "./build-plan.ts";
import { unexpandDirectUrls } from "../request/direct-url.ts";
import { FAST_PATH, machinePipConfig, prereleasesInstalled, requestRefusal, UvFailed, uvCheck, uvEnv, uvInstall, uvVersion, workerRefusal } from "./fast-path.ts";
import { IndexWatch, proxied } from "./index-watch.ts";
import { type Compiler, compileBytecode, startCompiler } from "./bytecode.ts";
import { saysNoSpace } from "./disk-full.ts";
import { NEUTRAL_VARIABLES, pipConfigSourceDigest } from "../request/installer-config.ts";
import { machinePipSettings, originsOf, type PipSettings, relocatingOptions, translateForUv, type UvTranslation } from "../request/pip-config.ts";
import type { InterpreterInfo } from "../request/interpreter.ts";
import { installedSet } from "../request/interpreter.ts";
import { pipCheck, pipCommand, pipInstall, requestFiles } from "./pip-path.ts";
import { type BuildUser, buildUserEnv } from "./build-user.ts";
import { giveTree, reclaimTree, removeTree } from "../../core/tree-owner.ts";
import { type BuildHooks, type BuildStep, installFailure, runTool } from "./run-tool.ts";
import { scanWorker } from "./worker-mirror.ts";
import { type AfterInstall, afterInstall, baseCheckHolds, dropStandins, placeStandins, readBaseCheck, returnStandins, saveBaseCheck, type StandinLease } from "./standins.ts";
import { findUv } from "./uv-tool.ts";
import { uvCacheOverride } from "./uv-cache.ts";
import { keepVenvTemplate, venvFromTemplate } from "./venv-template.ts";
import { writeFileNamed } from "../../core/atomic.ts";
import { checkLock, dropMislockedStandins, installPylock, lockedVersions, projectUvEnv, pylockVersions, restoreUninstalled, shadowedBy, syncProject } from "./locked-project.ts";
import type { Shadowed } from "../request/locked-project.ts";
import { withoutDeferred } from "../request/no-isolation.ts";
import { buildDeferred, type WheelReport } from "./wheelhouse.ts";

export type { BuildHooks, BuildStep } from "./run-tool.ts";
export { installerMessage } from "./run-tool.ts";

/**
 * The build, as the ADR decided: a bare venv, a .pth that adds the worker's
 * site directories with site.addsitedir (so its editable installs work too),
 * then an installer that sees the worker's packages as installed and installs
 * only what they do not satisfy: uv with the worker's distributions shown to
 * it (fast-path.ts) where that gives what pip gives, else pip run by the
 * env's own interpreter (pip-path.ts).
 */

export type InstallerPath = typeof FAST_PATH | "pip";

export interface BuildOutcome {
  venvCreator: "uv" | "venv";
  /** The installer and its version: `uv 0.13.9 (fast path)`, `pip 23.2.1`, `pip 24.0 (bundled)`. */
  installer: string;
  installerPath: InstallerPath;
  /** Why auto built with pip rather than the fast path; null when it did not have to. */
  fallback: string | null;
  installed: string[];
  check: string[];
  steps: { step: BuildStep; seconds: number }[];
  /** A uv project's env: the worker packages it holds the locked version of, over the worker's. */
  shadowed?: Shadowed[];
  /** The requirements built without isolation: compiled here or taken from the wheelhouse (wheelhouse.ts). */
  wheels?: WheelReport[];
}

export function envSitePackages(dir: string, info: InterpreterInfo): string {
  return join(dir, "lib", `python${info.pyVersion}`, "site-packages");
}

/** Environment for the installer: no PYTHONPATH leaking in, and, when isolated, none of pip's own config. */
export function installerEnv(plan: BuildPlan): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(plan.env)) {
    if (v === undefined) continue;
    if (k === "PYTHONPATH" || k === "PYTHONHOME" || k === "VIRTUAL_ENV" || k === "PYTHONNOUSERSITE") continue;
    if (plan.isolated && (k.startsWith("PIP_") || k.startsWith("UV_")) && !NEUTRAL_VARIABLES.has(k)) continue;
    env[k] = v;
  }
  env.PIP_DISABLE_PIP_VERSION_CHECK = "1";
  env.PIP_NO_INPUT = "1";
  // Python's tempfile reads TMPDIR, TEMP, then TMP; uv reads TMPDIR. All three, so none of the machine's wins.
  if (plan.tmpDir) Object.assign(env, { TMPDIR: plan.tmpDir, TEMP: plan.tmpDir, TMP: plan.tmpDir });
  const o = plan.flags;
  if (plan.isolated) {
    // /dev/null is the one value that makes pip skip every config file, site-wide ones too.
    env.PIP_CONFIG_FILE = "/dev/null";
    // Index URLs travel as variables, not argv: credentials stay out of `ps`. The files' own options stay in the files.
    if (o.indexUrl) env.PIP_INDEX_URL = o.indexUrl;
    if (o.extraIndexUrls.length) env.PIP_EXTRA_INDEX_URL = o.extraIndexUrls.join(" ");
    const links = flagFindLinks(plan);
    if (links.length) env.PIP_FIND_LINKS = links.join(" ");
  }
  // worker.offline: what is not here already (the worker's packages, local files, uv's cache) fails, never waits on an index.
  if (plan.offline) Object.assign(env, { PIP_NO_INDEX: "1", UV_OFFLINE: "1" });
  return env;
}

export async function buildEnv(plan: BuildPlan, hooks: BuildHooks = {}): Promise<BuildOutcome> {
  const deferred = plan.deferred ?? [];
  if (!deferred.length) return await installEnv(plan, hooks);
  if (plan.user) throw new UsageError(`--no-build-isolation-package ${deferred[0]!.name}: not yet on a worker with run_as (the build would run as the job's user against the worker's own wheelhouse)`);
  // The rest of the env first: what the deferred builds import is installed by then.
  const outcome = await installEnv({ ...plan, inputs: withoutDeferred(plan.inputs, deferred) }, hooks);
  const site = envSitePackages(plan.dir, plan.interpreter);
  const started = performance.now();
  const wheels = await buildDeferred(plan, deferred, installerEnv(plan), hooks, site);
  const seconds = (performance.now() - started) / 1000;
  outcome.steps.push({ step: "installing", seconds });
  hooks.onStepDone?.("installing", seconds);
  // The check of the whole env, the builds without isolation and what they brought included: the first install's said nothing of them.
  const envPython = join(plan.dir, "bin", "python");
  const pip = await pipCommand(plan, envPython, installerEnv(plan), hooks);
  hooks.onStep?.("checking", "pip check, after the builds without isolation");
  const checkStart = performance.now();
  const check = await pipCheck(plan, pip, installerEnv(plan), hooks);
  const checkSeconds = (performance.now() - checkStart) / 1000;
  outcome.steps.push({ step: "checking", seconds: checkSeconds });
  hooks.onStepDone?.("checking", checkSeconds);
  return { ...outcome, installed: installedSet([site]), wheels, check };
}

async function installEnv(plan: BuildPlan, hooks: BuildHooks): Promise<BuildOutcome> {
  const setting = plan.installer ?? "auto";
  const { path: uv, reason: noUv } = await findUv(plan, installerEnv(plan));
  if (plan.venvCreator === "uv" && !uv) throw new UsageError("GPULAYER_VENV_CREATOR=uv but uv is not on PATH");
  if (!(plan.venvCreator !== "venv" && uv) && !plan.interpreter.hasVenvModule) throw new UsageError(`--python: ${plan.interpreter.path} has no venv module (on Debian: apt-get install python3-venv), and uv is not on PATH`);
  // A uv project is uv's alone to install (its lock is uv's format): no pip to fall back to.
  const lock = plan.project ? `a uv project (--project ${plan.project.dir})` : plan.pylock ? `a pylock.toml (${plan.pylock})` : null;
  if (lock && (setting === "pip" || !uv)) throw new UsageError(`${lock} is installed by uv, ${setting === "pip" ? "but GPULAYER_INSTALLER=pip" : `and ${noUv ?? "uv is not available"}`}`);
  const refusal = lock ? null : setting === "pip" ? null : (noUv ?? requestRefusal(plan, uv));
  if (setting === "uv" && refusal) throw new UsageError(`GPULAYER_INSTALLER=uv, but the fast path cannot build this request: ${refusal}`);

  // The indexes are looked at while the build runs (index-watch.ts): one that does not answer stops it, and is named.
  const indexes = new IndexWatch();
  const o = plan.flags;
  if (!plan.inputs.noIndex && !plan.offline) indexes.watch([o.indexUrl, ...o.extraIndexUrls, ...plan.inputs.indexUrls].filter((u): u is string => Boolean(u)), "", proxied(plan.env));
  const watched: BuildPlan = { ...plan, signal: plan.signal ? AbortSignal.any([plan.signal, indexes.signal]) : indexes.signal };
  const steps: BuildOutcome["steps"] = [];
  try {
    if (setting === "pip" || refusal || !uv) return await attempt(watched, hooks, steps, null, refusal, indexes);
    try {
      return await attempt(watched, hooks, steps, uv, null, indexes);
    } catch (error) {
      if (!(error instanceof UvFailed)) throw error;
      if (plan.project || plan.pylock) throw error.failure;
      // A full disk is as full for pip: said at once, not after a second build.
      if (setting === "uv" || saysNoSpace([error.failure.message, error.failure.detail])) throw error.failure;
      // What uv tried is gone; pip builds the env from the start, and says why.
      removeTree(plan.dir); // the build's user's, when it has one: closed before it is removed
      return await attempt(watched, hooks, steps, null, error.reason, indexes);
    }
  } catch (error) {
    // A stop or a time limit is told by its owner; any other failure, when an index did not answer, is that index's.
    if (plan.signal?.aborted) throw error;
    throw (await indexes.failure()) ?? error;
  } finally {
    indexes.stop();
  }
}

/** One build from nothing: with uv when given one (unless the worker's packages rule it out), else with pip. */
async function attempt(plan: BuildPlan, hooks: BuildHooks, steps: BuildOutcome["steps"], uv: string | null, reason: string | null, indexes: IndexWatch): Promise<BuildOutcome> {
  let fallback = reason;
  const begin = (step: BuildStep, detail: string) => {
    hooks.onStep?.(step, detail);
    const t = performance.now();
    return () => {
      const seconds = (performance.now() - t) / 1000;
      steps.push({ step, seconds });
      hooks.onStepDone?.(step, seconds);
    };
  };
  const timed = async <T>(step: BuildStep, detail: string, fn: () => Promise<T>): Promise<T> => {
    const end = begin(step, detail);
    const result = await fn();
    end();
    return result;
  };
  const env = installerEnv(plan);
  const info = plan.interpreter;
  const venvUv = plan.venvCreator === "venv" ? null : (await findUv(plan, env)).path;
  const anyUv = uv ?? venvUv;
  const uvCache = anyUv ? await uvCacheOverride(anyUv, env, plan.toolsDir) : null;
  if (uvCache) env.UV_CACHE_DIR = uvCache;
  const user = plan.user;
  // What the build's user's processes get (build-user.ts): the build's environment, the user's caches.
  const userEnv = user ? { ...env, ...buildUserEnv(user) } : env;
  let venvCreator: "uv" | "venv" = venvUv ? "uv" : "venv";
  const fastEnv = uv ? uvEnv(plan, userEnv) : null;
  const project = plan.project && uv ? { ...plan.project, run: { uv, env: projectUvEnv(userEnv, plan.dir, join(plan.dir, ".gpulayer-no-config")), cwd: plan.cwd, hooks, signal: plan.signal, keep: plan.keep, as: user } } : null;
  // What pip in the env would find of the worker: read while uv judges a project's lock (neither builds anything).
  const scanning = uv ? scanWorker(info.path, info.siteDirs, env, join(plan.toolsDir, "worker-scan-v1"), Date.now()) : null;
  scanning?.catch(() => undefined); // a refused lock is the failure to tell; the scan's own is told where it is awaited
  // A stale lock is refused before anything is built, in uv's own judgement.
  // As the build's user with that user's caches (worker.run_as): the check may run the project's own build backend.
  if (project) await timed("checking", `${project.dir}/uv.lock is up to date (uv lock --check)`, () => checkLock(project, info.executable, project.run));

  // The worker's scan, and what the machine's pip configuration says: while the venv is made.
  // uv's venv for this interpreter, kept from an earlier build, is written out again (venv-template.ts): no process.
  const kept = venvUv && !existsSync(plan.dir) && venvFromTemplate(plan.dir, plan.toolsDir, venvUv, info);
  const [scan, machine] = await timed("creating", `virtual environment with ${venvCreator}${kept ? " (kept from an earlier build)" : ""}`, async () => {
    const argv = venvUv ? [venvUv, "venv", "--no-config", "--quiet", "--python", info.executable, plan.dir] : [info.executable, "-m", "venv", "--without-pip", plan.dir];
    const [{ code, lines }, scanned, machine] = await Promise.all([
      kept ? { code: 0, lines: [] } : runTool(argv, { env: venvUv ? uvEnv(plan, env) : env, cwd: plan.cwd, hooks, signal: plan.signal, keep: plan.keep }),
      scanning,
      // Asked for pip's path too: a setting that installs outside the env is refused on either.
      machineSettingsForUv(plan, env, indexes),
    ]);
    const venvArgv = [info.executable, "-m", "venv", "--without-pip", plan.dir];
    if (code !== 0 && venvUv && plan.venvCreator !== "uv" && info.hasVenvModule) {
      // A uv that cannot make the venv (a broken binary, say): the interpreter's own venv module makes it, as pip's path would.
      removeTree(plan.dir); // the build's user's, when it has one
      hooks.onStep?.("creating", `virtual environment with venv (${venvUv} venv exited ${code}${lines.length ? `: ${lines.at(-1)}` : ""})`);
      const again = await runTool(venvArgv, { env, cwd: plan.cwd, hooks, signal: plan.signal, keep: plan.keep });
      if (again.code !== 0) throw installFailure(`creating the virtual environment failed: ${info.executable} -m venv exited ${again.code}, after ${venvUv} venv exited ${code}`, again.lines);
      venvCreator = "venv";
    } else if (code !== 0) throw installFailure(`creating the virtual environment failed: ${argv[0]}${venvUv ? " venv" : " -m venv"} exited ${code}`, lines);
    else if (venvUv && !kept) keepVenvTemplate(plan.dir, plan.toolsDir, venvUv, info);
    return [scanned, machine] as const;
  });
  const dists = scan && "dists" in scan ? scan.dists : null;
  if (scan && "unsupported" in scan) fallback = scan.unsupported;
  if (machine && "fatal" in machine) throw new UsageError(machine.fatal);
  if (uv && machine && "refusal" in machine) fallback = machine.refusal;
  const translation = machine && "translation" in machine ? machine.translation : null;
  const locked = Boolean(project || plan.pylock);
  const refusal = dists && !locked ? workerRefusal(plan.inputs.requirements, dists) : null;
  if (refusal) fallback = refusal;
  const fast = Boolean(uv && dists && !refusal && !(machine && "refusal" in machine));
  if (locked && !fast) throw new UsageError(`${project ? `a uv project (--project ${project.dir})` : `a pylock.toml (${plan.pylock})`} is installed by uv with the worker's packages shown to it, which cannot be done here: ${fallback}`);
  if (plan.installer === "uv" && !fast) throw new UsageError(`GPULAYER_INSTALLER=uv, but the fast path cannot build this request: ${fallback}`);

  const site = envSitePackages(plan.dir, info);
  const envPython = join(plan.dir, "bin", "python");
  const compileOptions = { env: userEnv, cwd: plan.cwd, hooks, signal: plan.signal, keep: plan.keep, as: user, ...(plan.bytecodeStore ? { store: plan.bytecodeStore } : {}) };
  const standinRoot = join(plan.toolsDir, "standins-v2");
  let lease: StandinLease | null = null;
  await timed("linking", `${info.siteDirs.length} site dir(s) of ${info.path}${fast ? `; ${dists!.length} of its packages shown to uv` : ""}`, async () => {
    if (!existsSync(site)) throw new InstallError(`the new environment has no ${site}`, "");
    if (fast) lease = await placeStandins(site, plan.dir, dists!, standinRoot, Boolean(user));
    // addsitedir (not a bare path line) also runs the worker's own .pth files: editable installs keep working.
    const lines = info.siteDirs.map((d) => `import site; site.addsitedir(${JSON.stringify(d)})`);
    writeFileNamed(join(site, "_gpulayer_worker.pth"), `${lines.join("\n")}\n`);
  });

  const { requirements } = plan.inputs;
  const version = fast ? await uvVersion(uv!, plan.dir) : "";
  // What the installer reads, written while the env is the worker's alone; then env and TMPDIR are the user's (build-user.ts).
  const files = requirements.length && !project ? requestFiles(plan.dir, plan.inputs, fast) : null;
  let shadowed: Shadowed[] | undefined;
  if (user) {
    giveTree(plan.dir, user.uid, user.gid);
    // The folder only: what root's processes left in it stays theirs (a second attempt finds it the user's already).
    if (plan.tmpDir) lchownSync(plan.tmpDir, user.uid, user.gid);
  }
  // Removed by the worker once the env is its own again, not inside a tree the user holds.
  const request = files && user ? { ...files, done() {} } : (files ?? undefined);
  let dropped: AfterInstall | null = null;
  let installer: string;
  let check: string[];
  if (fast) {
    const standins: StandinLease = lease!;
    installer = `uv ${version} (fast path)`;
    // The worker's own findings, asked once per worker state while the env holds nothing but its placeholders (standins.ts).
    // A worker with no packages (a bare `uv venv`) has no findings: no process asked.
    const base = readBaseCheck(standinRoot, standins.state, version) ?? saveBaseCheck(standinRoot, standins.state, version, dists!.length ? await timed("checking", `uv pip check of the worker's ${dists!.length} packages (once per worker state)`, () => uvCheck(plan, uv!, envPython, fastEnv!, hooks)) : []);
    // Then, not before (the findings are the worker's whole state's, kept for every build): the worker's packages the
    // lock pins at another version lose their stand-ins, and uv installs the locked ones.
    const mislocked = locked ? dropMislockedStandins(site, dists!, project ? lockedVersions(project.dir) : pylockVersions(plan.pylock!)) : new Map<string, string>();
    let after: AfterInstall | null = null;
    let returned = false;
    const giveBack = async (state: AfterInstall) => {
      returned = true;
      // The user's placeholders go with the env once it is the worker's again (below); a failed env goes whole.
      if (user) dropped = state;
      else await returnStandins(site, plan.dir, standins, state, standinRoot);
    };
    // The compile runs while the placeholders go back (it lists the env's files first, and placeholders hold none)
    // and the worker's findings are checked against the env.
    let compiled: Promise<unknown> | null = null;
    let compiler: Compiler | null = null;
    try {
      if (requirements.length || locked) {
        const installing = project
          ? timed("installing", `the lock of ${project.dir} with uv sync --frozen`, () => syncProject(project, envPython, project.run))
          : plan.pylock
            ? timed("installing", `${plan.pylock} with ${installer}`, () => installPylock(plan.pylock!, envPython, { uv: uv!, env: uvEnv(plan, userEnv), cwd: plan.cwd, hooks, signal: plan.signal, keep: plan.keep, as: user, refresh: plan.inputs.locals.some((l) => l.kind !== "archive") }))
            : timed("installing", `${requirements.length} requirement(s) with ${installer}`, () => uvInstall(plan, uv!, envPython, uvEnv(plan, userEnv, translation), hooks, translation, request));
        // The compiler's interpreters start while uv installs (bytecode.ts); uv first, it is the longer road.
        compiler = startCompiler(envPython, compileOptions);
        await installing;
        if (locked) await restoreUninstalled(site, dists!, mislocked, user);
        const started = compiler;
        compiled = timed("compiling", "bytecode of the env's own packages", () => started.compile(site));
        compiled.catch(() => undefined); // told below, after the placeholders are back
      }
      after = afterInstall(site, standins);
      if (locked) shadowed = shadowedBy(dists!, mislocked, after.replaced, after.added);
      const pre = locked || plan.installer === "uv" || plan.inputs.optionsSeen.has("--pre") || translation?.args.includes("--prerelease") ? [] : prereleasesInstalled(site, after.kept);
      if (pre.length) throw new UvFailed(new InstallError(`uv chose pre-releases: ${pre.join(", ")}`, ""), `uv chose a pre-release (${pre.join(", ")}) without --pre; pip decides when one counts`);
      const held = plan.inputs.optionsSeen.has("--no-deps") ? null : baseCheckHolds(base, after, standins);
      if (held) check = held; // the worker's findings hold for this env (standins.ts)
      else {
        await compiled; // the check's line after the compile's, not while it runs (their times would read wrongly)
        check = await timed("checking", "uv pip check", () => uvCheck(plan, uv!, envPython, fastEnv!, hooks));
      }
      await giveBack(after);
    } finally {
      // The env keeps its own packages and the .pth link, exactly as pip leaves it; the placeholders go back for the next build, failed or not.
      if (!returned && !user) {
        try {
          await giveBack(after ?? afterInstall(site, standins));
        } catch {
          // the build's own failure is the one to tell
        }
      }
      // No compiler outlives the build, failed or not.
      await (compiled ?? compiler?.cancel())?.catch(() => undefined);
    }
    await compiled;
  } else {
    const pip = await pipCommand(plan, envPython, env, hooks);
    installer = pip.name;
    const why = fallback ? ` (not uv: ${fallback})` : "";
    if (requirements.length) await timed("installing", `${requirements.length} requirement(s) with ${pip.name}${why}`, () => pipInstall(plan, pip, userEnv, hooks, request));
    // pip compiles as it installs, unless its configuration says --no-compile: what is already there is skipped.
    [, check] = await Promise.all([
      timed("compiling", "bytecode of the env's own packages", () => compileBytecode(envPython, site, compileOptions)),
      timed("checking", "pip check, while the compile runs", () => pipCheck(plan, pip, userEnv, hooks)),
    ]);
  }
  if (user) takeBack(plan.dir, site, user, dropped);
  // A `${VAR}` value the installer wrote into a direct_url.json goes back to its name before the env is ready (or shipped); after the take-back, so no link the build left is followed.
  unexpandDirectUrls(site, plan.inputs.requirements);
  files?.done();
  return { venvCreator, installer, installerPath: fast ? FAST_PATH : "pip", fallback: fast ? null : fallback, installed: installedSet([site]), check, steps, ...(shadowed ? { shadowed } : {}) };
}

/**
 * The env the worker's again, once the user's last process of it has ended:
 * root's, readable by the user's group, writable by no one else
 * (core/tree-owner.ts). Then the placeholders go, and the folders the worker
 * writes into next must still be folders, not links the build left.
 */
function takeBack(dir: string, site: string, user: BuildUser, placeholders: AfterInstall | null): void {
  reclaimTree(dir, user.uid, user.gid);
  for (const folder of [dir, site, join(dir, ".gpulayer")]) {
    const st = lstatSync(folder, { throwIfNoEntry: false });
    if (st ? !st.isDirectory() : folder !== join(dir, ".gpulayer")) throw new InstallError(`the build left ${folder} as something other than a folder`, "");
  }
  if (placeholders) dropStandins(site, placeholders);
}

/**
 * The machine's pip configuration for the fast path: nothing when the request
 * is isolated from it or there is none; else pip's own reading of it,
 * translated for uv, or why uv cannot honour it (then pip builds, and says so).
 */
async function machineSettingsForUv(plan: BuildPlan, env: Record<string, string>, indexes: IndexWatch): Promise<{ translation: UvTranslation } | { refusal: string } | { fatal: string } | null> {
  if (plan.isolated) return null;
  const sources = machinePipConfig(plan.env);
  if (!sources.length) return null;
  const read = await readMachinePipSettings(plan, env, sources);
  if ("noPip" in read) return { refusal: `the machine's pip configuration applies (${sources.join(", ")}) and ${plan.interpreter.path} has no pip to read it` };
  if ("failed" in read) return { refusal: `the machine's pip configuration could not be read through pip (${read.failed})` };
  const { settings, outside } = read;
  // An index the configuration names that does not answer stops the build with one line, as a flag's does.
  const noIndex = plan.inputs.noIndex || Boolean(settings.options.no_index?.value);
  const indexUrls = noIndex ? [] : [settings.options.index_url?.value, ...((settings.options.extra_index_urls?.value as string[] | undefined) ?? [])].filter((u): u is string => typeof u === "string" && u !== "");
  indexes.watch(indexUrls, ` (set by the machine's pip configuration: ${originsOf(settings, ["--index-url", "--extra-index-url"], sources).join(", ")})`, proxied(plan.env) || Boolean(settings.options.proxy?.value));
  if (outside) return { fatal: outside };
  const translation = translateForUv(settings);
  if (!translation.untranslatable.length) return { translation };
  const what = translation.untranslatable.join(", ");
  return { refusal: `the machine's pip configuration sets ${what} (from ${originsOf(settings, translation.untranslatable, sources).join(", ")}), which uv cannot honour the same way; for the fast path, remove ${translation.untranslatable.length > 1 ? "them" : "it"} or give --index-url (which shuts the machine's pip configuration out)` };
}

/**
 * The machine's pip configuration (from `sources`) as pip itself reads it,
 * through the interpreter's pip or the one it bundles: a host build's and an
 * image build's alike. `outside`: the line refusing options that make pip
 * install outside the env, when it sets any.
 */
export async function readMachinePipSettings(plan: BuildPlan, env: Record<string, string>, sources: string[]): Promise<{ settings: PipSettings; outside: string | null } | { noPip: true } | { failed: string }> {
  const info = plan.interpreter;
  const hasPip = installedSet(info.siteDirs).some((p) => p.startsWith("pip=="));
  const bundled = info.ensurepipWheel && existsSync(info.ensurepipWheel) ? info.ensurepipWheel : undefined;
  if (!hasPip && !bundled) return { noPip: true };
  let settings: PipSettings;
  try {
    settings = await machinePipSettings(info.path, { env, pythonPath: hasPip ? undefined : bundled, cacheDir: plan.toolsDir, configDigest: pipConfigSourceDigest(plan.env) });
  } catch (error) {
    return { failed: (error as Error).message };
  }
  const relocating = relocatingOptions(settings);
  const outside = relocating.length
    ? `the machine's pip configuration sets ${relocating.join(", ")} (from ${originsOf(settings, relocating, sources).join(", ")}), which makes pip install outside the env; unset ${relocating.length > 1 ? "them" : "it"} for gpulayer, or give --index-url (which shuts the machine's pip configuration out)`
    : null;
  return { settings, outside };
}
