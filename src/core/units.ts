/**
 * Sizes as people write them: `50G`, `50GB`, `50GiB`, `500MiB`, `1.5T`,
 * `12345` (bytes). Parsed by the `bytes` package, which counts in powers of
 * 1024 (50G = 50 GiB). `bytes` alone would read `50G` as 50 bytes (it knows
 * only `kb`..`pb` and falls back to parseInt), so the suffix is normalised
 * first and anything else is refused. The package is loaded at the first
 * size read: settings import this module, and a warm prepare reads none.
 */
const SIZE = /^\s*(\d+(?:\.\d+)?)\s*(?:([kmgtp])(?:i?b)?|b)?\s*$/i;

export function parseSize(value: string | number): number | null {
  if (typeof value === "number") return Number.isFinite(value) && value >= 0 ? Math.floor(value) : null;
  const m = SIZE.exec(value);
  if (!m) return null;
  const bytes = require("bytes") as typeof import("bytes");
  const parsed = bytes.parse(m[2] ? `${m[1]}${m[2].toLowerCase()}b` : String(Math.floor(Number(m[1]))));
  return parsed === null || !Number.isFinite(parsed) ? null : parsed;
}

/** Sizes as parseSize reads them (powers of 1024: 50G = 50 GiB), the same unit in every command. */
export function formatBytes(n: number): string {
  const prettyBytes = (require("pretty-bytes") as typeof import("pretty-bytes")).default;
  return prettyBytes(n, { binary: true });
}

export const SIZE_HINT = "a size such as 50G, 500MiB, 1.5T or a number of bytes";

/** Durations: `10m`, `2h`, `1d`, `30s`, `0`; a bare number is seconds. Returns milliseconds. */
const DURATION = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h|d)?\s*$/i;
const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, sec: 1000, m: 60_000, min: 60_000, h: 3_600_000, d: 86_400_000 };

export function parseDuration(value: string): number | null {
  const m = DURATION.exec(value);
  if (!m) return null;
  return Math.round(Number(m[1]) * (UNIT_MS[(m[2] ?? "s").toLowerCase()] ?? 1000));
}

/** An elapsed time for people: `350 ms`, `2.41 s`, `3m12s`. */
export function formatSeconds(seconds: number): string {
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(2)} s`;
  const m = Math.floor(seconds / 60);
  return `${m}m${Math.round(seconds - m * 60)}s`;
}

/** A duration as parseDuration reads it back: the largest unit that holds it whole (10m, 2h, 1d, 90s). */
export function formatDuration(ms: number): string {
  const [unit, size] = (["d", "h", "m"] as const).map((u) => [u, UNIT_MS[u]!] as const).find(([, size]) => ms >= size && ms % size === 0) ?? ["s", 1000];
  return `${Math.round(ms / size)}${unit}`;
}

/** A percentage of a filesystem: `85` or `85%`, 0 to 100. */
export function parsePercent(value: string): number | null {
  const m = /^\s*(\d+(?:\.\d+)?)\s*%?\s*$/.exec(value);
  if (!m) return null;
  const n = Number(m[1]);
  return n >= 0 && n <= 100 ? n : null;
}
