import { basename, dirname, join, resolve } from "node:path";
import type { HomeLayout } from "../../config/paths.ts";
import { userHome } from "../../core/home.ts";
import { PythonProblem, UsageError } from "../../errors.ts";
import type { BuildHooks, BuildOutcome } from "../build/build.ts";
import { type CondaEnv, findCondaEnv } from "./conda.ts";
import { findLinksDigest } from "./content-digest.ts";
import { pipConfigDigest } from "./installer-config.ts";
import { baseFingerprint, runningInterpreter } from "./interpreter.ts";
import { envKey, type FlagOptions, keyDocument, requestSummary, type ResolvedRequest } from "./key.ts";
import type { Lease } from "../../core/lease.ts";
import { confineTo, scanRequest } from "./requirements.ts";
import { lockedProjectInputs, projectSummary } from "./locked-project.ts";
import { isPylockFile, pylockInputs } from "./pylock.ts";
import { buildVariables, deferredBuilds } from "./no-isolation.ts";
import type { InstallerSetting } from "../build/build-plan.ts";
import type { BuildUser } from "../build/build-user.ts";
import type { EnvironmentRequest } from "./request-schema.ts";
import type { FetchedEnv } from "../store/shipping.ts";
import { type EntryPaths, entryPaths, isReady, readMeta, touchLastUsed } from "../store/store.ts";
import { redactUrl } from "./url-credentials.ts";

// A request's key and the look for its env: all a warm prepare loads (env prepare's warm lane); building is in prepare.ts.

/**
 * A host build's stage of the request (env/request/request.ts hostRequest makes it): the EnvironmentRequest, resolved
 * against `cwd`, with the machine's settings for the build; the image and the time limit are taken out (timeoutMs).
 */
export interface PrepareRequest extends Omit<EnvironmentRequest, "image" | "prepareTimeoutMs"> {
  /** Relative paths (requirements file, local packages) resolve against this. */
  cwd: string;
  env: NodeJS.ProcessEnv;
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
  /** worker.run_as: a build runs as this user (build-user.ts); not in the key, as the installer is not. */
  buildAs?: BuildUser;
  /** With buildAs: the user's own copy of confineTo, which the build reads (and may write, as in-tree builds do) instead. */
  buildSource?: string;
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
  /** A uv project's env: the worker packages the lock brings its own version of (name, the worker's, the locked). */
  shadowed?: { name: string; worker: string; locked: string }[];
  /** Which installer built the env (`uv (fast path)` or `pip`); null for an env built before this was recorded. */
  installerPath: string | null;
  /** Why the fast path was not taken for it, when it was not. */
  installerFallback: string | null;
  /** Built: the requirements built without isolation, compiled now or taken from the wheelhouse. */
  wheels?: NonNullable<BuildOutcome["wheels"]>;
  /** Held when asked for (a job): released by the caller when it is done with the env. */
  lease?: Lease;
  /** The conda environment under the env, when the request named one: a job runs with its activation. */
  conda: CondaEnv | null;
}

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
    // No Python named anywhere: the one on PATH, which --python would only mislead about.
    const origin = req.pythonOrigin ?? (req.python === undefined ? "python3 on PATH (no Python named)" : undefined);
    if (error instanceof PythonProblem && origin && req.conda === undefined) throw new UsageError(`${origin}: ${error.problem}`);
    throw error;
  }
}

/** From a request to its key: stats, readdirs and a hash; no Python is started on the warm path (a wrapper script aside). */
export function resolveRequest(layout: HomeLayout, req: PrepareRequest, hooks: Pick<PrepareHooks, "onHashing"> = {}): ResolvedRequest {
  if (req.conda !== undefined && !req.conda.trim()) throw new UsageError("--conda: give a conda environment's name or path");
  if (req.conda !== undefined && req.python !== undefined) throw new UsageError(`--python ${req.python} and --conda ${req.conda} both name the base interpreter: give one`);
  const conda = req.conda === undefined ? null : findCondaEnv(req.conda, { env: req.env, home: userHome(req.env), cwd: req.cwd });
  const { info: interpreter, resolved } = namedBy(req, () => runningInterpreter(conda?.python ?? req.python, req.env, req.cwd, layout.interpreters));
  const ctx = { env: req.env, cwd: req.cwd, digestCache: layout.digests, confine: req.confineTo, onHashing: hooks.onHashing };
  if (req.project !== undefined && (req.requirementsFile !== undefined || req.specs.length)) throw new UsageError(`--project ${req.project}: the lock is the whole environment; give no requirements with it`);
  const project = req.project === undefined ? undefined : { dir: req.project, groups: req.groups ?? [], extras: req.extras ?? [] };
  const locked = project ? lockedProjectInputs(project, ctx) : null;
  const pylockFile = !project && req.requirementsFile !== undefined && isPylockFile(req.requirementsFile) ? resolve(req.cwd, req.requirementsFile) : undefined;
  // A lock under another name would be read as a requirements list, line by line, and fail on its first TOML line.
  if (!project && req.requirementsFile && basename(req.requirementsFile) === "uv.lock") throw new UsageError(`${req.requirementsFile}: a uv.lock is read with its project: give --project with the project's folder (${dirname(req.requirementsFile) || "."})`);
  if (!project && !pylockFile && req.requirementsFile?.endsWith(".toml")) throw new UsageError(`${req.requirementsFile}: a TOML file is read as a lock only when named pylock.toml or pylock.NAME.toml (PEP 751); for a uv project, give --project with its folder`);
  if (pylockFile && req.specs.length) throw new UsageError(`${req.requirementsFile}: the lock is the whole environment; give no requirements with it`);
  const pylock = pylockFile ? pylockInputs(pylockFile, ctx) : null;
  const inputs = locked?.inputs ?? pylock?.inputs ?? scanRequest({ requirementsFile: req.requirementsFile, specs: req.specs, specOrigin: req.specsOrigin }, ctx);
  for (const u of [req.indexUrl, ...req.extraIndexUrls]) {
    if (u && !/^(https?:\/\/[^\s/]|file:\/\/)/i.test(u)) throw new UsageError(`invalid index URL: ${redactUrl(u)} (expected http://, https:// or file://)`);
  }
  const flagLinks = req.findLinks.map((f) => {
    if (/^[a-z][a-z0-9+.-]*:\/\//i.test(f) && !/^file:/i.test(f)) return { url: f };
    const path = resolve(req.cwd, f.replace(/^file:\/\//i, ""));
    if (req.confineTo) confineTo(req.confineTo, path, "--find-links", "the find-links location");
    return { path, digest: findLinksDigest(path, layout.digests, hooks.onHashing) };
  });
  const deferred = deferredBuilds(req.noBuildIsolation ?? [], inputs, req.specsOrigin ?? "-p", Boolean(project));
  const flags: FlagOptions = { indexUrl: req.indexUrl, extraIndexUrls: req.extraIndexUrls, findLinks: flagLinks };
  // A file:// index is a folder read like a find-links one: in a remote request, inside the bundle too.
  if (req.confineTo) {
    for (const u of [req.indexUrl, ...req.extraIndexUrls, ...inputs.indexUrls]) {
      if (u && /^file:/i.test(u)) confineTo(req.confineTo, resolve(req.cwd, fileUrlPath(u)), "the index", "the file:// index");
    }
  }
  const fileIndexOptions = ["--index-url", "--extra-index-url", "--find-links", "--no-index"].some((o) => inputs.optionsSeen.has(o));
  // A lock's indexes are its own (pyproject.toml, uv.lock; a pylock's URLs): the machine's pip configuration is not read.
  const isolated = Boolean(project || pylock || req.indexUrl || req.extraIndexUrls.length || req.findLinks.length || fileIndexOptions);
  const machine = isolated ? null : pipConfigDigest(req.env, { cwd: req.cwd, digestCache: layout.digests, onHashing: hooks.onHashing });
  const doc = keyDocument({
    inputs,
    flags,
    interpreter,
    base: baseFingerprint(interpreter.siteDirs),
    installerConfig: machine?.digest ?? null,
    ...(conda ? { conda: { prefix: conda.prefix, meta: conda.metaDigest } } : {}),
    ...(locked ? { project: locked.key } : {}),
    ...(pylock ? { pylock: pylock.key } : {}),
    ...(deferred.length ? { noBuildIsolation: { names: deferred.map((d) => d.name), variables: buildVariables(req.env) } } : {}),
  });
  const summary = project ? projectSummary(project) : requestSummary(inputs);
  return { key: envKey(doc), doc, summary, inputs, flags, interpreter, interpreterVia: resolved.via, isolated, conda, ...(project ? { project } : {}), ...(pylockFile ? { pylock: pylockFile } : {}), ...(deferred.length ? { deferred } : {}), machineConfig: machine?.sources ?? null, machineFindLinks: machine?.findLinks ?? [] };
}

/**
 * The env of a request when it is ready here, else null: the look `prepareEnv` makes first, without a lock, a
 * lease or a build (`env prepare`'s warm lane). Ready is final (an entry is never unmade while ready but by gc,
 * which takes the lock first), so a look without the lock answers as one with it would.
 */
export function findPrepared(layout: HomeLayout, req: PrepareRequest, hooks: PrepareHooks = {}): PrepareResult | null {
  const started = performance.now();
  const resolved = resolveRequest(layout, req, hooks);
  const found = readyEntry(resolved, entryPaths(layout, resolved.key), started);
  // Only for an answer: a caller that goes on to prepareEnv when there is none would say it twice.
  if (found) hooks.onResolved?.(resolved);
  return found;
}

/** The env when ready (its last use touched), else null: every look of a prepare, with the lock held or not. */
export function readyEntry(resolved: ResolvedRequest, paths: EntryPaths, started: number): PrepareResult | null {
  if (!isReady(paths)) return null;
  touchLastUsed(paths);
  return preparedResult(resolved, paths, started, "reused");
}

/** What a prepare answers: a built env's facts from its build, a reused one's from its meta file. */
export function preparedResult(resolved: ResolvedRequest, paths: EntryPaths, started: number, status: PrepareResult["status"], build?: PrepareResult["build"], fetched?: FetchedEnv): PrepareResult {
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
    ...((build ? build.shadowed : meta?.shadowed) ? { shadowed: build ? build.shadowed : meta?.shadowed } : {}),
    ...(build?.wheels ? { wheels: build.wheels } : {}),
    installerPath: build?.installerPath ?? meta?.installerPath ?? null,
    installerFallback: build ? build.fallback : (meta?.installerFallback ?? null),
    conda: resolved.conda,
  };
}
