import { mkdirSync, readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import * as v from "valibot";
import type { HomeLayout } from "../config/paths.ts";
import { writeFileAtomic } from "../core/atomic.ts";
import { UsageError } from "../errors.ts";

/**
 * This machine's worker settings, saved by `gpulayer join` (without a server
 * URL) in $GPULAYER_HOME/worker.json and used by every later `join`: flags
 * win over GPULAYER_* variables, which win over this file.
 */
export interface WorkerSettings {
  python?: string;
  name?: string;
  labels?: Record<string, string>;
}

/** Made when a file is there to check, not when the module loads: the warm path builds no schema it does not use. */
function workerSettingsSchema() {
  return v.strictObject({ python: v.optional(v.string()), name: v.optional(v.string()), labels: v.optional(v.record(v.string(), v.string())) });
}

export function workerSettingsFile(layout: HomeLayout): string {
  return layout.workerSettings;
}

export function loadWorkerSettings(layout: HomeLayout): WorkerSettings {
  const file = workerSettingsFile(layout);
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch {
    return {};
  }
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch (error) {
    throw new UsageError(`${file}: not valid JSON: ${(error as Error).message}`);
  }
  const schema = workerSettingsSchema();
  const parsed = v.safeParse(schema, data);
  if (!parsed.success) throw new UsageError(`${file}: ${v.getDotPath(parsed.issues[0]) ?? ""}: ${parsed.issues[0].message}`);
  return parsed.output;
}

export function saveWorkerSettings(layout: HomeLayout, settings: WorkerSettings): string {
  const file = workerSettingsFile(layout);
  mkdirSync(dirname(file), { recursive: true });
  writeFileAtomic(file, `${JSON.stringify(settings, null, 2)}\n`);
  return file;
}

/** The `python` setting (flag > GPULAYER_PYTHON > config file) over the saved file; labels merge, a flag's value winning per key. */
export function mergeWorkerSettings(saved: WorkerSettings, given: { python?: string; name?: string; labels: Record<string, string> }): WorkerSettings {
  const python = given.python ?? saved.python;
  return {
    python: python && python.includes("/") ? resolve(python) : python,
    name: given.name ?? saved.name,
    labels: { ...(saved.labels ?? {}), ...given.labels },
  };
}
