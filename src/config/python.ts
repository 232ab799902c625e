import { loadWorkerSettings, workerSettingsFile } from "../worker/settings.ts";
import type { HomeLayout } from "./paths.ts";
import type { ResolvedSettings } from "./resolve.ts";

/** The worker's default Python, and where it was named, as messages say it. */
export interface DefaultPython {
  /** undefined: python3 on PATH. */
  python: string | undefined;
  origin: string;
}

/**
 * The worker's default Python when a request names none: the `python` setting
 * (--python > GPULAYER_PYTHON > config file), else the one `gpulayer join
 * --python` saved; undefined means python3 on PATH.
 */
export function defaultPython(layout: HomeLayout, settings: Pick<ResolvedSettings, "values" | "origins">): DefaultPython {
  const configured = settings.values.python;
  if (configured) {
    const o = settings.origins.python;
    return { python: configured, origin: o.source === "flag" ? "--python" : o.source === "env" ? "GPULAYER_PYTHON" : `python (in ${o.name})` };
  }
  const saved = loadWorkerSettings(layout).python;
  return saved ? { python: saved, origin: `the Python \`join --python\` saved (in ${workerSettingsFile(layout)})` } : { python: undefined, origin: "--python" };
}
