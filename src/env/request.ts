import { isAbsolute, resolve } from "node:path";

/** Where an environment's packages come from: the flags of `env prepare`, or the environment section of a job. */
export interface EnvironmentSource {
  requirementsFile?: string;
  specs: string[];
  python?: string;
  /** Where `python` was named, as messages say it (--python, GPULAYER_PYTHON, a job file's environment.python, ...). */
  pythonOrigin?: string;
  /** A conda environment on this machine (name or path): its Python is the base interpreter (conda.ts). */
  conda?: string;
  indexUrl?: string;
  extraIndexUrls: string[];
  findLinks: string[];
}

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
 * undefined: python3 on PATH).
 */
export function environmentRequest(asked: EnvironmentSource, base: string, defaultPython?: string, defaultOrigin?: string): EnvironmentSource {
  const path = (p: string) => (isAbsolute(p) ? p : resolve(base, p));
  const python = asked.python ?? defaultPython;
  const pythonOrigin = pythonOriginOf(asked, defaultPython !== undefined ? defaultOrigin : undefined);
  // A conda environment names the base interpreter itself: the default Python does not apply to it.
  const basePython = asked.conda === undefined ? python : asked.python;
  return {
    requirementsFile: asked.requirementsFile === undefined ? undefined : path(asked.requirementsFile),
    specs: asked.specs,
    python: basePython && basePython.includes("/") ? path(basePython) : basePython,
    ...(pythonOrigin && asked.conda === undefined ? { pythonOrigin } : {}),
    ...(asked.conda === undefined ? {} : { conda: asked.conda }),
    indexUrl: asked.indexUrl,
    extraIndexUrls: asked.extraIndexUrls,
    findLinks: asked.findLinks.map((f) => (isUrl(f) ? f : path(f))),
  };
}
