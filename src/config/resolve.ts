import { lstatSync, readFileSync, readlinkSync, statSync } from "node:fs";
import { userHome } from "../core/home.ts";
import { dirname, join, resolve } from "node:path";
import { UsageError } from "../errors.ts";
import { didYouMean } from "../core/suggest.ts";
import { databaseUrl, hidePassword, isProblem } from "./kinds.ts";
import { SETTING_NAMES, SETTINGS, type SettingDef, type SettingName, type SettingValues } from "./table.ts";

/** Where a setting's value came from: `gpulayer config` shows it, messages name it. */
export interface Origin {
  source: "flag" | "env" | "file" | "default";
  /** `--max-size`, `GPULAYER_CACHE_MAX_SIZE`, the config file's path, or `default`. */
  name: string;
}

export interface ResolvedSettings {
  /** `home` and `config` always hold a path: they are computed when nothing sets them. */
  values: SettingValues & { home: string; config: string };
  origins: Record<SettingName, Origin>;
  /** The config file read (or that would be), and whether it exists. */
  configFile: string;
  configFound: boolean;
}

/** Flag values as typed, by setting name: only the flags the running command has. */
export type FlagValues = Partial<Record<SettingName, string | undefined>>;

type Raw = string | number | boolean;
const MAX_CONFIG_BYTES = 1024 * 1024;

/** The file's settings by dotted name; an unknown key, a wrong shape or a key that cannot be set there is one line naming it. */
async function readConfigFile(file: string): Promise<Map<SettingName, Raw> | null> {
  let text: string;
  try {
    // No file is the common case: answered without an exception (a warm start would pay for its stack).
    const st = statSync(file, { throwIfNoEntry: false });
    if (!st) {
      // A link to nothing was meant to be a config file: say so rather than run on the defaults.
      if (lstatSync(file, { throwIfNoEntry: false })) throw new UsageError(`${file}: the config file is a symbolic link to nothing (${readlinkSync(file)})`);
      return null;
    }
    if (!st.isFile()) throw new UsageError(`${file}: the config file is not a regular file`);
    if (st.size > MAX_CONFIG_BYTES) throw new UsageError(`${file}: the config file is ${st.size} bytes, over the limit of 1 MiB`);
    text = readFileSync(file, "utf8");
    if (text.includes("\0")) throw new UsageError(`${file}: the config file holds binary data (a NUL byte), not YAML`);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    if (error instanceof UsageError || (error as NodeJS.ErrnoException).code === "ENOTDIR") throw error; // ENOTDIR: said by resolveSettings, which knows the home
    throw new UsageError(`${file}: cannot read the config file: ${(error as Error).message}`);
  }
  let data: unknown;
  try {
    // Imported, not required, and only when there is a file: its own chunk, which a warm prepare without one never loads.
    const { parse: parseYaml } = await import("yaml");
    data = parseYaml(text);
  } catch (error) {
    throw new UsageError(`${file}: not valid YAML: ${(error as Error).message.split("\n")[0]!.replace(/:\s*$/, "")}`);
  }
  const found = new Map<SettingName, Raw>();
  if (data === null || data === undefined) return found;
  if (typeof data !== "object" || Array.isArray(data)) throw new UsageError(`${file}: the config file must be a mapping of keys (cache, python, ...)`);
  const walk = (obj: Record<string, unknown>, prefix: string) => {
    for (const [key, value] of Object.entries(obj)) {
      const name = prefix ? `${prefix}.${key}` : key;
      const def = (SETTINGS as Record<string, SettingDef<unknown>>)[name];
      if (def) {
        if (def.inFile === false) throw new UsageError(`${file}: ${name}: cannot be set in the config file (set ${def.env})`);
        if (value === null || value === undefined) continue;
        if (typeof value === "object") throw new UsageError(`${file}: ${name}: expected a single value, not a ${Array.isArray(value) ? "list" : "mapping"}`);
        // `cache.max_size: 1G` and `cache: {max_size: 2G}` in one file: the same key twice, as YAML refuses a plain repeat.
        if (found.has(name as SettingName)) throw new UsageError(`${file}: ${name}: given twice (as a dotted key and inside its section)`);
        found.set(name as SettingName, value as Raw);
      } else if (SETTING_NAMES.some((n) => n.startsWith(`${name}.`))) {
        // A section (cache, container, ...): a mapping of its keys, or nothing; a value there is the wrong shape, not an unknown key.
        if (value === null || value === undefined) continue;
        if (typeof value !== "object" || Array.isArray(value)) throw new UsageError(`${file}: ${name}: expected a mapping of its keys (${SETTING_NAMES.filter((n) => n.startsWith(`${name}.`)).map((n) => n.slice(name.length + 1)).join(", ")}), not ${Array.isArray(value) ? "a list" : "a single value"}`);
        walk(value as Record<string, unknown>, name);
      } else throw new UsageError(`${file}: ${name}: unknown key${didYouMean(name, SETTING_NAMES.filter((n) => (SETTINGS as Record<string, SettingDef<unknown>>)[n]!.inFile !== false))}`);
    }
  };
  walk(data as Record<string, unknown>, "");
  return found;
}

function describe(name: SettingName, raw: Raw, origin: Origin): string {
  const kind = SETTINGS[name].kind as unknown;
  const shown = SETTINGS[name].kind.name === "secret" ? "***" : kind === databaseUrl ? hidePassword(String(raw)) : String(raw);
  if (origin.source === "env") return `${origin.name}=${shown} (environment)`;
  if (origin.source === "flag") return `${origin.name} ${shown}`;
  return `${name}: ${shown} (in ${origin.name})`;
}

/** Where gpulayer keeps everything: GPULAYER_HOME, else $XDG_CACHE_HOME/gpulayer, else ~/.cache/gpulayer. */
function homeOf(env: Record<string, string | undefined>): { path: string; origin: Origin } {
  if (env.GPULAYER_HOME) return { path: resolve(env.GPULAYER_HOME), origin: { source: "env", name: "GPULAYER_HOME" } };
  if (env.XDG_CACHE_HOME) return { path: join(resolve(env.XDG_CACHE_HOME), "gpulayer"), origin: { source: "default", name: "default" } };
  return { path: join(userHome(env), ".cache", "gpulayer"), origin: { source: "default", name: "default" } };
}

/** A path on the way to the config file is a file: which one, and the setting that named it (every command stops here first). */
function notAFolder(configFile: string, origin: Origin, home: string): string {
  let at = dirname(configFile);
  for (let up = at; up !== dirname(up); up = dirname(up)) {
    try {
      if (!statSync(up).isDirectory()) at = up;
    } catch {
      // under the file, or missing: look further up
    }
  }
  const named = origin.source === "env" ? `${origin.name}=${origin.name === "GPULAYER_HOME" ? home : configFile} (environment)` : `the home folder ${home} (the default; GPULAYER_HOME sets another)`;
  return `${named}: ${at} is not a folder`;
}

/**
 * Every setting, once: flag > GPULAYER_* variable > config file > default,
 * each value parsed by its kind and validated here, whatever its source. A
 * bad value anywhere is one UsageError (exit 2) naming its source.
 */
export async function resolveSettings(env: Record<string, string | undefined>, flags: FlagValues = {}, opts: { configMayBeMissing?: boolean } = {}): Promise<ResolvedSettings> {
  const home = homeOf(env);
  const configFile = env.GPULAYER_CONFIG ? resolve(env.GPULAYER_CONFIG) : join(home.path, "config.yaml");
  const fromFile = await readConfigFile(configFile).catch((error) => {
    throw (error as NodeJS.ErrnoException).code === "ENOTDIR" ? new UsageError(notAFolder(configFile, env.GPULAYER_CONFIG ? { source: "env", name: "GPULAYER_CONFIG" } : home.origin, home.path)) : error;
  });
  // A file named on purpose that is not there (a typo, say) would silently drop every setting in it.
  if (env.GPULAYER_CONFIG && fromFile === null && !opts.configMayBeMissing) throw new UsageError(`GPULAYER_CONFIG=${env.GPULAYER_CONFIG} (environment): no such file (unset it for ${join(home.path, "config.yaml")}, which may be absent)`);
  const values: Record<string, unknown> = {};
  const origins = {} as Record<SettingName, Origin>;
  for (const name of SETTING_NAMES) {
    const def = SETTINGS[name] as SettingDef<unknown>;
    let raw: Raw | undefined;
    let origin: Origin = { source: "default", name: "default" };
    const flag = flags[name];
    if (flag !== undefined && def.flag) [raw, origin] = [flag, { source: "flag", name: def.flag }];
    else if (env[def.env] !== undefined && env[def.env] !== "") [raw, origin] = [env[def.env]!, { source: "env", name: def.env }];
    else if (fromFile?.has(name)) [raw, origin] = [fromFile.get(name)!, { source: "file", name: configFile }];
    origins[name] = origin;
    if (raw === undefined) {
      values[name] = def.default;
      continue;
    }
    const parsed = def.kind.parse(raw);
    if (isProblem(parsed)) throw new UsageError(`${describe(name, raw, origin)}: ${parsed.problem}`);
    values[name] = parsed;
  }
  // Paths as absolute ones: later cwd changes (a job's workdir) must not move them.
  values.home = home.path;
  origins.home = home.origin;
  values.config = configFile;
  return { values: values as ResolvedSettings["values"], origins, configFile, configFound: fromFile !== null };
}
