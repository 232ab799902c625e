import { readFileSync } from "node:fs";
import * as v from "valibot";
import { parse as parseYaml } from "yaml";
import { UsageError } from "../errors.ts";
import { parseSize, SIZE_HINT } from "../gc/units.ts";
import { homeLayout } from "./paths.ts";

/**
 * The config file, $GPULAYER_HOME/config.yaml (or $GPULAYER_CONFIG). Strict:
 * an unknown key or a wrong value is an error naming its key path. Add new
 * settings here as keys of the schema; their precedence (flag > GPULAYER_*
 * variable > this file > default) is applied where they are used, with
 * `layered` below.
 *
 *   cache:
 *     max_size: 200G        # gpulayer gc's limit when --max-size is not given
 *   python: /opt/venv/bin/python   # the worker's Python (GPULAYER_PYTHON)
 *   installer: auto          # auto | uv | pip (GPULAYER_INSTALLER)
 *   venv_creator: auto       # auto | uv | venv (GPULAYER_VENV_CREATOR)
 *   cancel_grace: 10         # seconds between SIGTERM and SIGKILL (GPULAYER_CANCEL_GRACE)
 *   container:
 *     engine: docker         # docker | podman (GPULAYER_CONTAINER_ENGINE)
 *     network: host          # (GPULAYER_CONTAINER_NETWORK)
 *     options: "--shm-size 8g"   # extra engine options (GPULAYER_CONTAINER_OPTIONS)
 *   server: http://coord:7070    # (GPULAYER_SERVER)
 */
const Size = v.union([v.pipe(v.string(), v.check((s) => parseSize(s) !== null, `must be ${SIZE_HINT}`)), v.pipe(v.number(), v.minValue(0, "must be 0 or more"))], `must be ${SIZE_HINT}`);

const Text = v.pipe(v.string("must be a string"), v.minLength(1, "must not be empty"));

export const SettingsSchema = v.strictObject({
  cache: v.optional(
    v.strictObject({
      max_size: v.optional(Size),
    }),
  ),
  python: v.optional(Text),
  installer: v.optional(v.picklist(["auto", "uv", "pip"], "must be auto, uv or pip")),
  venv_creator: v.optional(v.picklist(["auto", "uv", "venv"], "must be auto, uv or venv")),
  cancel_grace: v.optional(v.pipe(v.number("must be a number of seconds"), v.minValue(0, "must be 0 or more"))),
  container: v.optional(
    v.strictObject({
      engine: v.optional(v.picklist(["docker", "podman"], "must be docker or podman")),
      network: v.optional(Text),
      options: v.optional(v.string("must be a string")),
    }),
  ),
  server: v.optional(Text),
});

/**
 * The config file's settings as defaults for their GPULAYER_* variables: a
 * variable already set wins (flag > variable > file > default), and every
 * module keeps reading one place, the environment.
 */
export function settingsAsEnvDefaults(settings: Settings, env: NodeJS.ProcessEnv): Record<string, string> {
  const pairs: [string, string | number | undefined][] = [
    ["GPULAYER_PYTHON", settings.python],
    ["GPULAYER_INSTALLER", settings.installer],
    ["GPULAYER_VENV_CREATOR", settings.venv_creator],
    ["GPULAYER_CANCEL_GRACE", settings.cancel_grace],
    ["GPULAYER_CONTAINER_ENGINE", settings.container?.engine],
    ["GPULAYER_CONTAINER_NETWORK", settings.container?.network],
    ["GPULAYER_CONTAINER_OPTIONS", settings.container?.options],
    ["GPULAYER_SERVER", settings.server],
  ];
  const defaults: Record<string, string> = {};
  for (const [name, value] of pairs) if (value !== undefined && !env[name]) defaults[name] = String(value);
  return defaults;
}

export type Settings = v.InferOutput<typeof SettingsSchema>;

function describeIssue(issue: v.BaseIssue<unknown>): string {
  const path = v.getDotPath(issue) ?? "";
  if (issue.expected === "never" && issue.path?.length) return `${path}: unknown key`;
  const message = /^Invalid (type|key)/.test(issue.message) ? `expected ${issue.expected}, got ${issue.received}` : issue.message;
  return path ? `${path}: ${message}` : message;
}

/** Validate parsed config data; the first problem becomes one line naming the key path. */
export function validateSettings(data: unknown, source: string): Settings {
  if (data === null || data === undefined) return {};
  if (typeof data !== "object" || Array.isArray(data)) throw new UsageError(`${source}: the config file must be a mapping of keys (cache, ...)`);
  const result = v.safeParse(SettingsSchema, data);
  if (!result.success) throw new UsageError(`${source}: ${describeIssue(result.issues[0])}`);
  return result.output;
}

/** Read and validate the config file; a missing file is no settings at all. */
export function loadSettings(file: string = homeLayout().configFile): Settings {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return {};
    throw new UsageError(`${file}: cannot read the config file: ${(error as Error).message}`);
  }
  let data: unknown;
  try {
    data = parseYaml(text);
  } catch (error) {
    throw new UsageError(`${file}: not valid YAML: ${(error as Error).message.split("\n")[0]}`);
  }
  return validateSettings(data, file);
}

/** Where a setting's value came from, for messages such as "limit 200 GiB (from config.yaml)". */
export type SettingSource = "flag" | "env" | "config";

export interface Layered<T> {
  value: T;
  source: SettingSource;
  /** How to name it to the user: `--max-size`, `GPULAYER_CACHE_MAX_SIZE`, `cache.max_size in /path/config.yaml`. */
  origin: string;
}

/** Precedence for every setting: flag > GPULAYER_* variable > config file (> the caller's default). */
export function layered<T>(flag: { name: string; value: T | undefined }, envVar: { name: string; value: T | undefined }, config: { name: string; value: T | undefined }): Layered<T> | undefined {
  if (flag.value !== undefined) return { value: flag.value, source: "flag", origin: flag.name };
  if (envVar.value !== undefined && envVar.value !== "") return { value: envVar.value, source: "env", origin: envVar.name };
  if (config.value !== undefined) return { value: config.value, source: "config", origin: config.name };
  return undefined;
}

/** `cache.max_size` from the config file, as written (a size string or a number of bytes). */
export function configCacheMaxSize(settings: Settings): string | number | undefined {
  return settings.cache?.max_size;
}
