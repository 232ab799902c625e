import { mkdirSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";
import { artifactConditions, type BuildTicket, type FetchedEnv, fetchFolder, installFetched, type Shipping, type WheelSharing } from "./store/shipping.ts";
import type { HomeLayout } from "../config/paths.ts";
import { InstallError, UsageError } from "../errors.ts";
import { type BuildAs, relocate, relocateInputs, userCacheDir } from "./build/build-user.ts";
import type { BuildStep, KeepGroup } from "./build/run-tool.ts";
import type { BuildPlan } from "./build/build-plan.ts";
import type { ResolvedRequest } from "./request/key.ts";
import type { LockedProject } from "./request/locked-project.ts";
import { acquireEntry } from "./store/cache-entry.ts";
import { diskFull } from "./build/disk-full.ts";
import { inputsReport } from "./request/inputs-report.ts";
import { prepareLimit } from "./prepare-limit.ts";
import { nearestEnv } from "./request/nearest.ts";
import { type PrepareHooks, type PrepareRequest, type PrepareResult, preparedResult, readyEntry, resolveRequest } from "./request/lookup.ts";
import { diskUsage, type EntryPaths, openAndMeasure, entryPaths, isReady, markReady, namesInStore, removeEntryDir } from "./store/store.ts";
import { unexpandVariables } from "./request/url-credentials.ts";
import { resolveToolShim } from "./request/shims.ts";
import { definedOnly } from "../core/defined-env.ts";

/** What `env prepare` would do, without building or locking: the key, reuse or build, the inputs the key covers, and for a build the nearest env built here and what differs from it. */
export function dryRunPrepare(layout: HomeLayout, req: PrepareRequest, hooks: Pick<PrepareHooks, "onHashing"> = {}) {
  const resolved = resolveRequest(layout, req, hooks);
  const paths = entryPaths(layout, resolved.key);
  const would = isReady(paths) ? ("reuse" as const) : ("build" as const);
  // A lock pyproject.toml has moved away from: refused here as the build would refuse it (a ready env's lock passed).
  if (would === "build" && resolved.project) checkLocks([resolved.project], resolved.interpreter.path, uvForChecks(req.uv, req.env, req.cwd), req.env);
  return { key: resolved.key, would, path: paths.dir, summary: resolved.summary, inputs: inputsReport(resolved), nearest: would === "build" ? nearestEnv(layout, resolved) : null };
}

export async function prepareEnv(layout: HomeLayout, req: PrepareRequest, opts: { hooks?: PrepareHooks; leaseHolder?: string; shipping?: Shipping } = {}): Promise<PrepareResult> {
  const started = performance.now();
  const hooks = opts.hooks ?? {};
  const venvCreator = req.venvCreator ?? "auto";
  const installer = req.installer ?? "auto";
  const resolved = resolveRequest(layout, req, hooks);
  hooks.onResolved?.(resolved);
  const paths = entryPaths(layout, resolved.key);
  // One signal for the time limit and a cancel; `step` says what was running when it came.
  const limit = prepareLimit(req.timeoutMs, req.signal);
  const stop = limit.signal;
  let step = "waiting for another build of it";
  const watched: PrepareHooks = { ...hooks, onStep: (s, detail) => ((step = `${s} ${detail}`), hooks.onStep?.(s, detail)) };
  const done = (status: PrepareResult["status"], build?: PrepareResult["build"], fetched?: FetchedEnv) => preparedResult(resolved, paths, started, status, build, fetched);
  // The lease comes before the lookup, so gc can never take the env between the two.
  const { entry, lease } = await acquireEntry({
    lease: opts.leaseHolder ? { layout, kind: "env", id: resolved.key, holder: opts.leaseHolder } : undefined,
    lock: paths.lock,
    reuse: () => readyEntry(resolved, paths, started),
    build: async (lock) => {
      const ticket = opts.shipping ? await fromFleet(layout, opts.shipping, resolved, paths, watched, stop) : null;
      if (ticket && "fetched" in ticket) return done("fetched", undefined, ticket.fetched);
      try {
        const built = await buildUnderLock(layout, resolved, { ...req, venvCreator, installer, signal: stop }, paths, watched, lock.keep, opts.shipping?.wheels, Boolean(ticket?.build.offline));
        ticket?.build.built();
        return done("built", built);
      } catch (error) {
        ticket?.build.failed();
        throw error;
      }
    },
    onWait: () => hooks.onWait?.(`another process is building ${resolved.key.slice(0, 12)}; waiting for it`),
    signal: stop,
  }).catch((error) => {
    throw limit.stopped(step) ?? diskFull(error, { home: layout.root, envDir: paths.dir, step }) ?? error;
  });
  return { ...entry, lease };
}

/** Before a build: the env from another worker of the fleet, unpacked and marked ready here; or a ticket to build it. */
async function fromFleet(layout: HomeLayout, shipping: Shipping, resolved: ResolvedRequest, paths: EntryPaths, hooks: PrepareHooks, signal?: AbortSignal): Promise<{ fetched: FetchedEnv } | { build: BuildTicket }> {
  const into = fetchFolder(layout, resolved.key);
  const t = performance.now();
  try {
    const deferred = resolved.deferred?.map((d) => d.name);
    const got = await shipping.acquire({ key: resolved.key, conditions: artifactConditions(paths.dir, resolved.interpreter, resolved.doc.base), into, signal, onStep: hooks.onStep, ...(deferred ? { deferred } : {}) });
    if ("fetched" in got) {
      installFetched(layout, resolved.key, paths, into, got.fetched);
      hooks.onStepDone?.("fetching", (performance.now() - t) / 1000);
    }
    return got;
  } finally {
    rmSync(into, { recursive: true, force: true });
  }
}

/**
 * worker.run_as: the build's user, its caches, and where it reads the
 * request: the key was read from confineTo (the worker's copy of the bundle,
 * which the user cannot reach), the installers read the same files in the
 * user's copy (buildSource, the job's workdir).
 */
function buildAs(layout: HomeLayout, resolved: ResolvedRequest, req: PrepareRequest): { user: BuildAs; moved(path: string): string } | null {
  if (!req.buildAs) return null;
  const editable = resolved.inputs.locals.find((l) => l.kind === "editable");
  if (editable) throw new UsageError(`worker.run_as: an editable requirement (-e ${editable.path}) would link the env to the job's own copy of its folder, which goes with the job; install it without -e on a --run-as worker`);
  const user = { ...req.buildAs, cacheDir: userCacheDir(layout.users, req.buildAs) };
  const { confineTo: from, buildSource: to } = req;
  return { user, moved: (path) => (from && to ? relocate(path, from, to) : path) };
}

async function buildUnderLock(layout: HomeLayout, resolved: ResolvedRequest, req: PrepareRequest, paths: EntryPaths, hooks: PrepareHooks, keep: KeepGroup, wheelSharing?: WheelSharing, offline = false): Promise<PrepareResult["build"]> {
  const started = performance.now();
  // A `${VAR}` value pip prints (a URL it fetched, an error) goes on by its name: what is shown, sent or stored never holds it.
  const { hide, hooks: shownHooks } = hidingVariables(resolved, hooks);
  // Remains of a build that failed or was killed: never reused, always rebuilt.
  removeEntryDir(layout, paths.tmp);
  removeEntryDir(layout, paths.dir);
  try {
    mkdirSync(paths.tmp, { recursive: true, mode: 0o700 });
    const as = buildAs(layout, resolved, req);
    // Loaded for a build only: the installers' code (and pep440's) costs the warm path milliseconds.
    const { buildEnv } = await import("./build/build.ts");
    const outcome = await buildEnv(buildPlanOf(layout, resolved, req, { dir: paths.dir, tmpDir: paths.tmp, keep, as, wheelSharing, offline }), shownHooks);
    removeEntryDir(layout, paths.tmp);
    // Opened to all as it is measured (one walk), unless built as a --run-as user (taken back for that user's group).
    const sizeBytes = as ? diskUsage(paths.dir) : openAndMeasure(paths.dir);
    markReady(paths, {
      key: resolved.key,
      path: paths.dir,
      python: join(paths.dir, "bin", "python"),
      created: new Date().toISOString(),
      buildSeconds: (performance.now() - started) / 1000,
      sizeBytes,
      venvCreator: outcome.venvCreator,
      installer: outcome.installer,
      installerPath: outcome.installerPath,
      installerFallback: outcome.fallback,
      summary: resolved.summary,
      request: resolved.doc,
      inputs: inputsReport(resolved),
      installed: outcome.installed,
      check: outcome.check,
      ...(outcome.shadowed ? { shadowed: outcome.shadowed } : {}),
      ...(outcome.wheels ? { wheels: outcome.wheels } : {}),
    }, { openToAll: !as, openedAlready: true });
    return { ...outcome, sizeBytes };
  } catch (error) {
    // A failure is never reused: nothing of it stays in the cache, nor of what its installers left in their TMPDIR.
    removeEntryDir(layout, paths.tmp);
    removeEntryDir(layout, paths.dir);
    if (error instanceof Error) {
      error.message = hide(error.message);
      if (error instanceof InstallError) Object.defineProperty(error, "detail", { value: hide(error.detail) });
    }
    throw error;
  }
}

/** The one assembly of what a build is given, from the resolved request: for an entry (buildUnderLock) and a warm-up (warmBuilder). */
function buildPlanOf(layout: HomeLayout, resolved: ResolvedRequest, req: PrepareRequest, at: { dir: string; tmpDir: string; keep?: KeepGroup; as?: ReturnType<typeof buildAs>; wheelSharing?: WheelSharing; offline?: boolean }): BuildPlan {
  const { as, wheelSharing, offline } = at;
  return {
    dir: at.dir,
    interpreter: resolved.interpreter,
    inputs: as ? relocateInputs(resolved.inputs, as.moved) : resolved.inputs,
    flags: as ? { ...resolved.flags, findLinks: resolved.flags.findLinks.map((f) => (f.path ? { ...f, path: as.moved(f.path) } : f)) } : resolved.flags,
    isolated: resolved.isolated,
    ...(resolved.deferred ? { deferred: resolved.deferred, wheelhouse: layout.wheelhouse, ...(wheelSharing ? { wheelSharing } : {}) } : {}),
    ...(resolved.project ? { project: as ? { ...resolved.project, dir: as.moved(resolved.project.dir) } : resolved.project } : {}),
    ...(resolved.pylock ? { pylock: as ? as.moved(resolved.pylock) : resolved.pylock } : {}),
    env: req.env,
    toolsDir: layout.tools,
    bytecodeStore: layout.bytecode,
    cwd: as ? as.moved(req.cwd) : req.cwd,
    user: as?.user,
    venvCreator: req.venvCreator ?? "auto",
    installer: req.installer ?? "auto",
    uv: req.uv,
    signal: req.signal,
    ...(at.keep ? { keep: at.keep } : {}),
    tmpDir: at.tmpDir,
    ...(offline ? { offline } : {}),
  };
}

/** Scratch folders of warm-ups, beside the entries: never a name the cache lists (store.ts lists 64-hex names only). */
const WARMING = ".warm-";

/**
 * What a home's first build makes once, made ahead of any build: the
 * interpreter's probe, the scan of its packages, their stand-ins (a slot) and
 * uv's check of them, uv's venv for it. The request (a worker's: its Python,
 * nothing asked) is built in a scratch folder beside the entries and removed:
 * nothing enters the cache and no entry's lock is taken, so a job that comes
 * meanwhile builds as it would have. A worker does it on joining, so its first
 * build costs what a build in a used home does. Not for a build as another
 * user (worker.run_as): its stand-ins are written for each build.
 */
export async function warmBuilder(layout: HomeLayout, req: PrepareRequest, hooks: PrepareHooks = {}): Promise<{ seconds: number; python: string }> {
  const started = performance.now();
  const resolved = resolveRequest(layout, req, hooks);
  // Leftovers of a warm-up killed midway: one worker per home warms it, so none is in use.
  for (const n of namesInStore(layout)) if (n.startsWith(WARMING)) removeEntryDir(layout, join(layout.envs, n));
  const dir = join(layout.envs, `${WARMING}${crypto.randomUUID()}`);
  const tmpDir = `${dir}.tmp`;
  try {
    mkdirSync(tmpDir, { recursive: true, mode: 0o700 });
    const { buildEnv } = await import("./build/build.ts");
    await buildEnv(buildPlanOf(layout, resolved, req, { dir, tmpDir }), hooks);
  } finally {
    removeEntryDir(layout, tmpDir);
    removeEntryDir(layout, dir);
  }
  return { seconds: (performance.now() - started) / 1000, python: resolved.interpreter.path };
}

/** The build's hooks with every set `${VAR}` value of the request put back as `${NAME}` in what they pass on. */
function hidingVariables(resolved: ResolvedRequest, hooks: PrepareHooks): { hide: (text: string) => string; hooks: PrepareHooks } {
  const variables = [...resolved.inputs.variables].filter(([, value]) => value);
  if (!variables.length) return { hide: (text) => text, hooks };
  const hide = (text: string) => unexpandVariables(text, variables);
  const { onOutput, onStep } = hooks;
  return { hide, hooks: { ...hooks, ...(onOutput ? { onOutput: (line: string) => onOutput(hide(line)) } : {}), ...(onStep ? { onStep: (step: BuildStep, detail: string) => onStep(step, hide(detail)) } : {}) } };
}

/** The uv that checks a lock without building: the uv setting's, else the one on PATH (never a download); null for none. */
function uvForChecks(setting: string | undefined, env: Record<string, string | undefined>, cwd: string): string | null {
  const onPath = setting === "off" ? null : setting && setting !== "auto" ? setting : Bun.which("uv", { PATH: env.PATH ?? "" });
  const uv = onPath ? resolveToolShim(onPath, env, cwd) : null;
  return typeof uv === "string" ? uv : null;
}

/** `uv lock --check` (and the selection) of each project, as the build checks it; nothing without a uv. */
function checkLocks(projects: LockedProject[], python: string, uv: string | null, env: Record<string, string | undefined>): void {
  if (!uv) return;
  // Loaded for a lock only: the build's side of projects.
  const { checkLockNow } = require("./build/locked-project.ts") as typeof import("./build/locked-project.ts");
  for (const project of projects) checkLockNow(project, python, uv, definedOnly(env));
}

/**
 * A stale lock, or a group or extra the project does not define, refused on a
 * client, in the user's own paths, before anything is packed or sent to a
 * server: as `job run` and `env prepare` refuse them without one. With no uv
 * or python3 on this machine's PATH the worker refuses them instead (a client
 * needs neither to submit).
 */
export function refuseStaleLocks(requests: { project?: string; groups?: string[]; extras?: string[] }[], env: Record<string, string | undefined>, cwd: string): void {
  const projects = requests.flatMap((r) => (r.project === undefined ? [] : [{ dir: resolve(cwd, r.project), groups: r.groups ?? [], extras: r.extras ?? [] }]));
  const python = projects.length ? Bun.which("python3", { PATH: env.PATH ?? "" }) : null;
  if (python) checkLocks(projects, python, uvForChecks(undefined, env, cwd), env);
}
