import { UsageError } from "../errors.ts";
import type { Watermark } from "./policy.ts";
import { parseDuration, parsePercent } from "../core/units.ts";

/** gc's flags as typed, before validation (--max-size is a setting: cache.max_size). */
export interface GcFlags {
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

/** gc's own flags, validated, with cache.max_size (--max-size > GPULAYER_CACHE_MAX_SIZE > config file) resolved at the top. */
export function resolveGcLimits(flags: GcFlags, cacheMaxSize: { bytes: number; origin: string } | undefined): GcLimits {
  const maxSize = cacheMaxSize;

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
