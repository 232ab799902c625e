import { loadWorkerSettings } from "../worker/settings.ts";
import type { HomeLayout } from "./paths.ts";

/**
 * The worker's default Python when a request names none: the `python` setting
 * (--python > GPULAYER_PYTHON > config file), else the one `gpulayer join
 * --python` saved; undefined means python3 on PATH.
 */
export function defaultPython(layout: HomeLayout, configured: string | undefined): string | undefined {
  return configured || loadWorkerSettings(layout).python;
}
