import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { configCacheMaxSize, layered, loadSettings } from "../config/settings.ts";
import { UsageError } from "../errors.ts";
import type { Watermark } from "./policy.ts";
import { parseDuration, parsePercent, parseSize, SIZE_HINT } from "./units.ts";

/** gc's flags as typed, before validation. */
export interface GcFlags {
  maxSize?: string;
  minAge?: string;
  keep: string[];
  highWatermark?: string;
  lowWatermark?: string;
}

export interface GcLimits {
  /** undefined: no size limit from anywhere. */
  maxSize?: { bytes: number; origin: string };
  watermark?: Watermark;
  minAgeMs: number;
  keep: string[];
}

/** Never remove what was just built. */
export const DEFAULT_MIN_AGE_MS = 10 * 60_000;
export const MAX_SIZE_ENV = "GPULAYER_CACHE_MAX_SIZE";

/** Merge flags, GPULAYER_CACHE_MAX_SIZE and config.yaml (in that order of precedence), then validate once. */
export function resolveGcLimits(flags: GcFlags, layout: HomeLayout, env: NodeJS.ProcessEnv = process.env): GcLimits {
  const settings = loadSettings(layout.configFile);
  const configName = `cache.max_size in ${layout.configFile.startsWith(layout.root) ? join("$GPULAYER_HOME", layout.configFile.slice(layout.root.length)) : layout.configFile}`;
  const chosen = layered<string | number>({ name: "--max-size", value: flags.maxSize }, { name: MAX_SIZE_ENV, value: env[MAX_SIZE_ENV] }, { name: configName, value: configCacheMaxSize(settings) });
  let maxSize: GcLimits["maxSize"];
  if (chosen) {
    const bytes = parseSize(chosen.value);
    if (bytes === null) throw new UsageError(`${chosen.origin}: not a size: ${JSON.stringify(String(chosen.value))} (expected ${SIZE_HINT})`);
    maxSize = { bytes, origin: chosen.origin };
  }

  let minAgeMs = DEFAULT_MIN_AGE_MS;
  if (flags.minAge !== undefined) {
    const ms = parseDuration(flags.minAge);
    if (ms === null) throw new UsageError(`--min-age: not a duration: ${JSON.stringify(flags.minAge)} (expected e.g. 10m, 2h, 1d, 30s or 0)`);
    minAgeMs = ms;
  }

  let watermark: Watermark | undefined;
  if (flags.lowWatermark !== undefined && flags.highWatermark === undefined) throw new UsageError("--low-watermark needs --high-watermark");
  if (flags.highWatermark !== undefined) {
    const high = parsePercent(flags.highWatermark);
    if (high === null) throw new UsageError(`--high-watermark: not a percentage from 0 to 100: ${JSON.stringify(flags.highWatermark)}`);
    const low = flags.lowWatermark === undefined ? Math.max(0, high - 5) : parsePercent(flags.lowWatermark);
    if (low === null) throw new UsageError(`--low-watermark: not a percentage from 0 to 100: ${JSON.stringify(flags.lowWatermark)}`);
    if (low > high) throw new UsageError(`--low-watermark (${low}%) must not be above --high-watermark (${high}%)`);
    watermark = { high, low };
  }

  const keep = flags.keep.map((k) => k.trim()).filter(Boolean);
  for (const k of flags.keep) if (!k.trim()) throw new UsageError("--keep needs a key (or a prefix of one)");
  return { maxSize, watermark, minAgeMs, keep };
}
