import { UsageError } from "../../errors.ts";
import { normalizeName } from "./canonical.ts";
import type { RequestInputs } from "./requirements.ts";

/**
 * A requirement built without build isolation (`--no-build-isolation-package`,
 * `environment.no_build_isolation`): left out of the install, then built with
 * the env's and the worker's packages importable (env/build/wheelhouse.ts).
 */
export interface DeferredBuild {
  /** The project's name, PEP 503 form. */
  name: string;
  /** Its place among the request's specs, and its origin there (`-p[2]`): the first install goes without it. */
  specIndex: number;
  origin: string;
  /** The requirement as the installer takes it (`${VAR}`s expanded: never stored). */
  install: string;
}

/** The variables that change what a CUDA extension's build makes (MAX_JOBS changes only how fast): in the env's key and the wheelhouse's. */
export const BUILD_VARIABLES = ["TORCH_CUDA_ARCH_LIST", "CUDA_HOME"] as const;

/** Their values as the build sees them, unset ones as null. */
export function buildVariables(env: NodeJS.ProcessEnv): Record<string, string | null> {
  return Object.fromEntries(BUILD_VARIABLES.map((v) => [v, env[v] ?? null]));
}

/** Each name the request builds last, found among its specs; one line for a name that is not one of them. */
export function deferredBuilds(names: string[], inputs: RequestInputs, specOrigin: string, project: boolean): DeferredBuild[] {
  if (!names.length) return [];
  if (project) throw new UsageError(`--no-build-isolation-package ${names[0]}: a uv project's lock is installed whole by uv sync; set no-build-isolation-package in its pyproject.toml ([tool.uv])`);
  const found: DeferredBuild[] = [];
  for (const given of names) {
    const name = normalizeName(given.trim());
    if (!/^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$/.test(name)) throw new UsageError(`--no-build-isolation-package ${given}: not a project name`);
    if (found.some((d) => d.name === name)) continue;
    const at = inputs.specs.findIndex((_, i) => inputs.requirements.some((r) => r.origin === `${specOrigin}[${i}]` && r.name === name));
    if (at < 0) throw new UsageError(`--no-build-isolation-package ${given}: not one of the requirements given by name (-p, or a job file's environment.requirements list); gpulayer builds last only a package named there`);
    const install = inputs.requirements.find((r) => r.origin === `${specOrigin}[${at}]`)!.install;
    found.push({ name, specIndex: at, origin: `${specOrigin}[${at}]`, install });
  }
  return found.sort((a, b) => (a.name < b.name ? -1 : 1));
}

/** The request's inputs without the deferred specs: what the first install reads. */
export function withoutDeferred(inputs: RequestInputs, deferred: DeferredBuild[]): RequestInputs {
  if (!deferred.length) return inputs;
  const out = new Set(deferred.map((d) => d.specIndex));
  const origins = new Set(deferred.map((d) => d.origin));
  return { ...inputs, specs: inputs.specs.filter((_, i) => !out.has(i)), requirements: inputs.requirements.filter((r) => !origins.has(r.origin)) };
}
