import { loadWorkerSettings } from "../worker/settings.ts";
import type { HomeLayout } from "./paths.ts";

/**
 * The worker's default Python when a request names none: GPULAYER_PYTHON, else
 * the one `gpulayer join --python` saved; undefined means python3 on PATH.
 */
export function defaultPython(layout: HomeLayout, env: NodeJS.ProcessEnv = process.env): string | undefined {
  return env.GPULAYER_PYTHON || loadWorkerSettings(layout).python;
}
