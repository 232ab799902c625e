import { mkdirSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";
import { userHome } from "../core/home.ts";
import { artifactConditions, type BuildTicket, type FetchedEnv, fetchFolder, installFetched, type Shipping } from "./shipping.ts";
import type { HomeLayout } from "../config/paths.ts";
import { ExitCode, InstallError, PythonProblem, UsageError, UserError } from "../errors.ts";
import type { BuildHooks, BuildOutcome } from "./build.ts";
import type { KeepGroup } from "./run-tool.ts";
import type { InstallerSetting } from "./build-plan.ts";
import { redactUrl } from "./url-credentials.ts";
import { pipConfigDigest } from "./installer-config.ts";
import { baseFingerprint, runningInterpreter } from "./interpreter.ts";
import { envKey, type FlagOptions, keyDocument, requestSummary, type ResolvedRequest } from "./key.ts";
import type { Lease } from "../core/lease.ts";
import { acquireEntry } from "./cache-entry.ts";
import { diskFull } from "./disk-full.ts";
import { confineTo, scanRequest } from "./requirements.ts";
import type { EnvironmentSource } from "./request.ts";
import { findLinksDigest } from "./content-digest.ts";
import { type CondaEnv, findCondaEnv } from "./conda.ts";
import { inputsReport } from "./inputs-report.ts";
import { diskUsage, entryPaths, isReady, markReady, readMeta, removeEntryDir, touchLastUsed } from "./store.ts";

/** What a user asks for, and where: relative paths resolve against `cwd`; `env` is the installers' environment. */
export interface PrepareRequest extends EnvironmentSource {
  /** Relative paths (requirements file, local packages) resolve against this. */
  cwd: string;
  env: NodeJS.ProcessEnv;
  /** How messages name the specs: `-p` on the command line, `environment.requirements` in a job file. */
  specOrigin?: string;
  venvCreator?: "uv" | "venv" | "auto";
  /** A remote job's bundle: what the request reaches must be inside it (see ScanContext.confine). */
  confineTo?: string;
  /** The `uv` setting (auto, a path, off); auto when not given. */
  uv?: string;
  /** The longest preparing may take, waiting for another builder included (prepare_timeout); none: no limit. */
  timeoutMs?: number;
  /** A cancel: the running installer's process group is killed and the build is left nowhere. */
  signal?: AbortSignal;
  /** The `installer` setting; auto when not given. Not in the key: either path builds the same env. */
  installer?: InstallerSetting;
}

export interface PrepareHooks extends BuildHooks {
  onResolved?(resolved: ResolvedRequest): void;
  onWait?(message: string): void;
  /** A big local file is hashed for the key (a wheel in a find-links folder): seconds, once; later runs have its stat. */
  onHashing?(path: string, bytes: number): void;
}

export interface PrepareResult {
  key: string;
  path: string;
  python: string;
  status: "built" | "reused" | "fetched";
  seconds: number;
  summary: string;
  /** Unpacked from another worker's artifact (status fetched). */
  fetched?: FetchedEnv;
  build?: BuildOutcome & { sizeBytes: number };
  check: string[];
  /** Which installer built the env (`uv (fast path)` or `pip`); null for an env built before this was recorded. */
  installerPath: string | null;
  /** Why the fast path was not taken for it, when it was not. */
  installerFallback: string | null;
  /** Held when asked for (a job): released by the caller when it is done with the env. */
  lease?: Lease;
  /** The conda environment under the env, when the request named one: a job runs with its activation. */
  conda: CondaEnv | null;
}

/** From a request to its key: stats, readdirs and a hash; no Python is started on the warm path (a wrapper script aside). */
/** A file:// URL's path, %-escapes undone where they are well formed (else as written: confined either way). */
function fileUrlPath(url: string): string {
  const path = url.replace(/^file:(\/\/)?/i, "");
  try {
    return decodeURIComponent(path);
  } catch {
    return path;
  }
}

/** A problem with the Python, named as the request named it (GPULAYER_PYTHON, a job file's environment.python, ...). */
function namedBy<T>(req: PrepareRequest, probe: () => T): T {
  try {
    return probe();
  } catch (error) {
    if (error instanceof PythonProblem && req.pythonOrigin && req.conda === undefined) throw new UsageError(`${req.pythonOrigin}: ${error.problem}`);
    throw error;
  }
}

export function resolveRequest(layout: HomeLayout, req: PrepareRequest, hooks: Pick<PrepareHooks, "onHashing"> = {}): ResolvedRequest {
  if (req.conda !== undefined && !req.conda.trim()) throw new UsageError("--conda: give a conda environment's name or path");
  if (req.conda !== undefined && req.python !== undefined) throw new UsageError(`--python ${req.python} and --conda ${req.conda} both name the base interpreter: give one`);
  const conda = req.conda === undefined ? null : findCondaEnv(req.conda, { env: req.env, home: userHome(req.env), cwd: req.cwd });
  const { info: interpreter, resolved } = namedBy(req, () => runningInterpreter(conda?.python ?? req.python, req.env, req.cwd, layout.interpreters));
  const ctx = { env: req.env, cwd: req.cwd, digestCache: layout.digests, confine: req.confineTo, onHashing: hooks.onHashing };
  const inputs = scanRequest({ requirementsFile: req.requirementsFile, specs: req.specs, specOrigin: req.specOrigin }, ctx);
  for (const u of [req.indexUrl, ...req.extraIndexUrls]) {
    if (u && !/^(https?:\/\/[^\s/]|file:\/\/)/i.test(u)) throw new UsageError(`invalid index URL: ${redactUrl(u)} (expected http://, https:// or file://)`);
  }
  const flagLinks = req.findLinks.map((f) => {
    if (/^[a-z][a-z0-9+.-]*:\/\//i.test(f) && !/^file:/i.test(f)) return { url: f };
    const path = resolve(req.cwd, f.replace(/^file:\/\//i, ""));
    if (req.confineTo) confineTo(req.confineTo, path, "--find-links", "the find-links location");
    return { path, digest: findLinksDigest(path, layout.digests, hooks.onHashing) };
  });
  const flags: FlagOptions = { indexUrl: req.indexUrl, extraIndexUrls: req.extraIndexUrls, findLinks: flagLinks };
  // A file:// index is a folder read like a find-links one: in a remote request, inside the bundle too.
  if (req.confineTo) {
    for (const u of [req.indexUrl, ...req.extraIndexUrls, ...inputs.indexUrls]) {
      if (u && /^file:/i.test(u)) confineTo(req.confineTo, resolve(req.cwd, fileUrlPath(u)), "the index", "the file:// index");
    }
  }
  const fileIndexOptions = ["--index-url", "--extra-index-url", "--find-links", "--no-index"].some((o) => inputs.optionsSeen.has(o));
  const isolated = Boolean(req.indexUrl || req.extraIndexUrls.length || req.findLinks.length || fileIndexOptions);
  const machine = isolated ? null : pipConfigDigest(req.env, { cwd: req.cwd, digestCache: layout.digests, onHashing: hooks.onHashing });
  const doc = keyDocument({
    inputs,
    flags,
    interpreter,
    base: baseFingerprint(interpreter.siteDirs),
    installerConfig: machine?.digest ?? null,
    ...(conda ? { conda: { prefix: conda.prefix, meta: conda.metaDigest } } : {}),
  });
  return { key: envKey(doc), doc, summary: requestSummary(inputs), inputs, flags, interpreter, interpreterVia: resolved.via, isolated, conda, machineConfig: machine?.sources ?? null, machineFindLinks: machine?.findLinks ?? [] };
}

/** What `env prepare` would do, without building or locking: the key, reuse or build, and the inputs the key covers. */
export function dryRunPrepare(layout: HomeLayout, req: PrepareRequest, hooks: Pick<PrepareHooks, "onHashing"> = {}) {
  const resolved = resolveRequest(layout, req, hooks);
  const paths = entryPaths(layout, resolved.key);
  return { key: resolved.key, would: isReady(paths) ? ("reuse" as const) : ("build" as const), path: paths.dir, summary: resolved.summary, inputs: inputsReport(resolved) };
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
  const limit = req.timeoutMs ? AbortSignal.timeout(req.timeoutMs) : undefined;
  const signal = [limit, req.signal].filter((s): s is AbortSignal => Boolean(s));
  const stop = signal.length ? AbortSignal.any(signal) : undefined;
  let step = "waiting for another build of it";
  const watched: PrepareHooks = { ...hooks, onStep: (s, detail) => ((step = `${s} ${detail}`), hooks.onStep?.(s, detail)) };
  const done = (status: PrepareResult["status"], build?: PrepareResult["build"], fetched?: FetchedEnv): Omit<PrepareResult, "lease"> => {
    const meta = build ? null : readMeta(paths);
    return {
      key: resolved.key,
      path: paths.dir,
      python: join(paths.dir, "bin", "python"),
      status,
      seconds: (performance.now() - started) / 1000,
      summary: resolved.summary,
      build,
      ...(fetched ? { fetched } : {}),
      check: build?.check ?? meta?.check ?? [],
      installerPath: build?.installerPath ?? meta?.installerPath ?? null,
      installerFallback: build ? build.fallback : (meta?.installerFallback ?? null),
      conda: resolved.conda,
    };
  };
  // The lease comes before the lookup, so gc can never take the env between the two.
  const { entry, lease } = await acquireEntry({
    lease: opts.leaseHolder ? { layout, kind: "env", id: resolved.key, holder: opts.leaseHolder } : undefined,
    lock: paths.lock,
    reuse: () => {
      if (!isReady(paths)) return null;
      touchLastUsed(paths);
      return done("reused");
    },
    build: async (lock) => {
      const ticket = opts.shipping ? await fromFleet(layout, opts.shipping, resolved, paths, watched, stop) : null;
      if (ticket && "fetched" in ticket) return done("fetched", undefined, ticket.fetched);
      try {
        const built = await buildUnderLock(layout, resolved, { ...req, venvCreator, installer, signal: stop }, paths, watched, lock.keep);
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
    if (!stop?.aborted) throw diskFull(error, { home: layout.root, envDir: paths.dir, step }) ?? error;
    if (limit?.aborted) throw new InstallError(`timed out after ${formatLimit(req.timeoutMs!)} while ${step} (prepare_timeout; nothing was kept)`, "");
    throw new UserError(`stopped while ${step} (nothing was kept)`, ExitCode.cancelled);
  });
  return { ...entry, lease };
}

/** Before a build: the env from another worker of the fleet, unpacked and marked ready here; or a ticket to build it. */
async function fromFleet(layout: HomeLayout, shipping: Shipping, resolved: ResolvedRequest, paths: ReturnType<typeof entryPaths>, hooks: PrepareHooks, signal?: AbortSignal): Promise<{ fetched: FetchedEnv } | { build: BuildTicket }> {
  const into = fetchFolder(layout, resolved.key);
  hooks.onStep?.("fetching", `env ${resolved.key.slice(0, 12)} from the fleet`);
  const t = performance.now();
  try {
    const got = await shipping.acquire({ key: resolved.key, conditions: artifactConditions(paths.dir, resolved.interpreter, resolved.doc.base), into, signal, onStep: (detail) => hooks.onStep?.("fetching", detail) });
    if ("fetched" in got) {
      installFetched(layout, resolved.key, paths, into, got.fetched);
      hooks.onStepDone?.("fetching", (performance.now() - t) / 1000);
    }
    return got;
  } finally {
    rmSync(into, { recursive: true, force: true });
  }
}

const formatLimit = (ms: number) => (ms % 1000 === 0 ? `${ms / 1000} s` : `${(ms / 1000).toFixed(1)} s`);

async function buildUnderLock(layout: HomeLayout, resolved: ResolvedRequest, req: PrepareRequest, paths: ReturnType<typeof entryPaths>, hooks: PrepareHooks, keep: KeepGroup): Promise<PrepareResult["build"]> {
  const started = performance.now();
  // Remains of a build that failed or was killed: never reused, always rebuilt.
  removeEntryDir(layout, paths.tmp);
  removeEntryDir(layout, paths.dir);
  try {
    mkdirSync(paths.tmp, { recursive: true, mode: 0o700 });
    // Loaded for a build only: the installers' code (and pep440's) costs the warm path milliseconds.
    const { buildEnv } = await import("./build.ts");
    const outcome = await buildEnv(
      {
        dir: paths.dir,
        interpreter: resolved.interpreter,
        inputs: resolved.inputs,
        flags: resolved.flags,
        isolated: resolved.isolated,
        env: req.env,
        toolsDir: layout.tools,
        cwd: req.cwd,
        venvCreator: req.venvCreator,
        installer: req.installer,
        uv: req.uv,
        signal: req.signal,
        keep,
        tmpDir: paths.tmp,
      },
      hooks,
    );
    rmSync(paths.tmp, { recursive: true, force: true });
    const sizeBytes = diskUsage(paths.dir);
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
    });
    return { ...outcome, sizeBytes };
  } catch (error) {
    // A failure is never reused: nothing of it stays in the cache, nor of what its installers left in their TMPDIR.
    removeEntryDir(layout, paths.tmp);
    removeEntryDir(layout, paths.dir);
    throw error;
  }
}
