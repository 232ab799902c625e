import { isAbsolute, resolve } from "node:path";
import type { BuildUser } from "../build/build-user.ts";
import type { InstallerSetting } from "../build/build-plan.ts";
import { UsageError } from "../../errors.ts";
import type { PrepareRequest } from "./lookup.ts";
import { isPylockFile } from "./pylock.ts";
import { lockLocalSources } from "./locked-project.ts";
import type { EnvironmentRequest } from "./request-schema.ts";

export type { EnvironmentRequest } from "./request-schema.ts";

/** `https://host/wheels`, `file:///srv/wheels`: kept as written; anything else is a path. */
export const isUrl = (text: string): boolean => /^[a-z][a-z0-9+.-]*:\/\//i.test(text);

/** How messages name the Python a request runs: where it was named (a flag, unless said), else where the default came from. */
export function pythonOriginOf(asked: { python?: string; pythonOrigin?: string }, defaultOrigin: string | undefined): string | undefined {
  return asked.python !== undefined ? (asked.pythonOrigin ?? "--python") : defaultOrigin;
}

/**
 * An environment request as every caller must see it (local `job run`, `env
 * prepare`, a job file, a worker's task): one rule for each field. Relative
 * paths (the requirements file, local find-links, a Python given as a path)
 * resolve against `base`; URLs stay URLs; a Python given as a bare name is
 * looked up on PATH later. No Python named: `defaultPython`, which the top
 * resolves once (--python > GPULAYER_PYTHON > config file > `join --python`;
 * undefined: python3 on PATH). The image and the time limit pass through;
 * confineTo is the caller's to set.
 */
export function environmentRequest(asked: EnvironmentRequest, base: string, defaultPython?: string, defaultOrigin?: string): EnvironmentRequest {
  const path = (p: string) => (isAbsolute(p) ? p : resolve(base, p));
  // A conda environment names the base interpreter itself, and an image brings its own: the default Python applies to neither.
  const ownPython = asked.conda !== undefined || asked.image !== undefined;
  const basePython = ownPython ? asked.python : (asked.python ?? defaultPython);
  const pythonOrigin = pythonOriginOf(asked, defaultPython !== undefined && !ownPython ? defaultOrigin : undefined);
  return {
    requirementsFile: asked.requirementsFile === undefined ? undefined : path(asked.requirementsFile),
    specs: asked.specs,
    ...(asked.specsOrigin && asked.specs.length ? { specsOrigin: asked.specsOrigin } : {}),
    python: basePython && basePython.includes("/") ? path(basePython) : basePython,
    ...(pythonOrigin && asked.conda === undefined ? { pythonOrigin } : {}),
    ...(asked.conda === undefined ? {} : { conda: asked.conda }),
    indexUrl: asked.indexUrl,
    extraIndexUrls: asked.extraIndexUrls,
    findLinks: asked.findLinks.map((f) => (isUrl(f) ? f : path(f))),
    ...(asked.image === undefined ? {} : { image: asked.image }),
    ...(asked.project === undefined ? {} : { project: path(asked.project), groups: asked.groups ?? [], extras: asked.extras ?? [] }),
    ...(asked.noBuildIsolation?.length ? { noBuildIsolation: asked.noBuildIsolation } : {}),
    ...(asked.prepareTimeoutMs === undefined ? {} : { prepareTimeoutMs: asked.prepareTimeoutMs }),
  };
}

/**
 * A request an image cannot honour is refused, in one line, before anything is pulled or built: its env is built
 * by the image's own Python from requirements (or a uv project's lock, exported), so a conda environment, a Python of its own,
 * packages built without isolation or a pylock.toml would otherwise be dropped or misread without a word. Called
 * where a job's spec is made and again in prepare(), for a request that came from a server.
 */
export function refuseOnImage(request: EnvironmentRequest): void {
  const image = request.image;
  if (image === undefined) return;
  const on = `does not go with an image (${image})`;
  // The image's Python installs the lock's export: a local package of the lock (the project itself, when it is a package) has no place there.
  const locals = request.project !== undefined && isAbsolute(request.project) ? lockLocalSources(request.project) : [];
  if (locals.length) throw new UsageError(`a uv project whose lock installs local packages (${locals.join(", ")}) ${on} yet: set [tool.uv] package = false for the project itself, publish the others to an index, or build the image with them`);
  if (request.conda !== undefined) throw new UsageError(`a conda environment (${request.conda}) ${on}: the env is built for the image's own Python`);
  if (request.python !== undefined) {
    const origin = request.pythonOrigin ?? "--python";
    throw new UsageError(`${origin === "--python" ? `--python ${request.python}` : `${origin} (${request.python})`} ${on}: the env is built for the image's own Python`);
  }
  if (request.noBuildIsolation?.length) throw new UsageError(`no build isolation (${request.noBuildIsolation.join(", ")}) ${on} yet: build those packages into the image, or run it without --image`);
  if (request.requirementsFile !== undefined && isPylockFile(request.requirementsFile)) throw new UsageError(`a pylock.toml (${request.requirementsFile}) ${on} yet: give its packages as requirements, or run it without --image`);
}

/** What a machine's settings say about building an env, resolved once at the top (the runner's, a worker's, `env prepare`'s). */
export interface EnvSettings {
  /** What the installers (and a job) inherit: the caller's environment minus gpulayer's own secrets. */
  env: Record<string, string>;
  /** prepare_timeout, for a request that names none. */
  prepareTimeoutMs: number;
  installer: InstallerSetting;
  venvCreator: "auto" | "uv" | "venv";
  /** The `uv` setting. */
  uv: string;
  /** For a request that names no Python: the one default (see environmentRequest). */
  defaultPython?: string;
  /** Where defaultPython was named, as messages say it. */
  defaultPythonOrigin?: string;
  /** worker.run_as: the build of the env (and a job's command) run as this user. */
  runAs?: BuildUser;
}

/** A request and where it is read: the one input of every prepare (jobs/prepare.ts) and of every look at its key. */
export interface RequestAt {
  request: EnvironmentRequest;
  /**
   * The job's (or the command's) folder: relative paths resolve here, unless the request is confined to a bundle
   * (request.confineTo: a remote job's immutable copy, named by content, so its key is every worker's). With
   * worker.run_as the build reads the user's copy, this folder, instead (env/build/build-user.ts).
   */
  workdir: string;
}

/** Where a request's relative paths are read: the bundle it is confined to, else the workdir. */
export const requestDir = (at: RequestAt): string => at.request.confineTo ?? at.workdir;

/**
 * The host env a request asks for, as prepareEnv takes it: the one assembly, for a local job, a worker's job or
 * prepare task, `env prepare` and its warm lane, and `job run --dry-run`; so one request has one key everywhere.
 */
export function hostRequest(settings: EnvSettings, at: RequestAt): PrepareRequest {
  const dir = requestDir(at);
  const { image: _image, prepareTimeoutMs, ...request } = environmentRequest(at.request, dir, settings.defaultPython, settings.defaultPythonOrigin);
  return {
    ...request,
    cwd: dir,
    env: settings.env,
    installer: settings.installer,
    venvCreator: settings.venvCreator,
    uv: settings.uv,
    timeoutMs: prepareTimeoutMs ?? settings.prepareTimeoutMs,
    ...(at.request.confineTo === undefined ? {} : { confineTo: at.request.confineTo }),
    // worker.run_as: the build runs as the job's user, from the job's own copy of its folder (env/build/build-user.ts).
    ...(settings.runAs ? { buildAs: settings.runAs, buildSource: at.workdir } : {}),
  };
}
