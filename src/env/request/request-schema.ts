import * as v from "valibot";

/**
 * What a job or task asks of its environment: one shape from the job file and
 * the flags, through the job's record, onto the wire to a worker and into
 * `prepare` (jobs/prepare.ts). Its own module, so the warm path, which needs
 * only the type, never loads valibot.
 */

const Str = v.pipe(v.string(), v.maxLength(64 * 1024));
const StrList = v.pipe(v.array(Str), v.maxLength(1000));

/** The fields that travel (paths relative to the bundle on the wire; absolute once resolved on a machine). */
export const WireEnvironmentSchema = v.strictObject({
  requirementsFile: v.optional(Str),
  specs: StrList,
  /** How messages name the specs: `-p` on the command line (the default), `job.yaml: environment.requirements` in a job file. */
  specsOrigin: v.optional(Str),
  python: v.optional(Str),
  /** A conda environment on the machine (name or path): its Python is the base interpreter (env/request/conda.ts). */
  conda: v.optional(Str),
  indexUrl: v.optional(Str),
  extraIndexUrls: StrList,
  findLinks: StrList,
  image: v.optional(Str),
  /** A uv project's folder (pyproject.toml + uv.lock): the lock is the environment (env/locked-project.ts). */
  project: v.optional(Str),
  /** With project: the dependency groups and extras, as `uv sync --group/--extra` takes them. */
  groups: v.optional(StrList),
  extras: v.optional(StrList),
  /** environment.no_build_isolation or --no-build-isolation-package: built after the rest of the env, against it and the worker (env/build/wheelhouse.ts). */
  noBuildIsolation: v.optional(StrList),
  /** environment.prepare_timeout or --prepare-timeout, in ms; else the machine's own prepare_timeout. */
  prepareTimeoutMs: v.optional(v.pipe(v.number(), v.integer(), v.minValue(1))),
});

/** The request as a machine holds it: the wire's fields and two that never travel (a worker sets its own). */
export const EnvironmentRequestSchema = v.strictObject({
  ...WireEnvironmentSchema.entries,
  /** Where `python` was named, as messages say it (--python, GPULAYER_PYTHON, a job file's environment.python, ...). */
  pythonOrigin: v.optional(Str),
  /** A remote job's bundle on its worker: the request may reach nothing outside it. */
  confineTo: v.optional(Str),
});

export type EnvironmentRequest = v.InferOutput<typeof EnvironmentRequestSchema>;
export type WireEnvironment = v.InferOutput<typeof WireEnvironmentSchema>;
