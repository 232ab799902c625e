import { existsSync, statfsSync } from "node:fs";
import { dirname } from "node:path";
import type { GcEntry, SkipReason } from "./types.ts";
import { formatDuration } from "../core/units.ts";

/** The rules gc applies, as pure functions of what it measured. */

export interface Watermark {
  /** Percent of the filesystem in use above which gc starts removing. */
  high: number;
  /** Percent it removes down to. */
  low: number;
}

export interface FsUsage {
  path: string;
  usedBytes: number;
  /** Free to unprivileged users (df's "Avail"): used + avail is what df's Use% divides by. */
  availBytes: number;
}

/** The filesystem holding the cache (the nearest existing folder up from `path`). */
export function fsUsage(path: string): FsUsage {
  let p = path;
  while (!existsSync(p) && dirname(p) !== p) p = dirname(p);
  const s = statfsSync(p);
  const block = s.frsize || s.bsize;
  return { path: p, usedBytes: (s.blocks - s.bfree) * block, availBytes: s.bavail * block };
}

export function usedPercent(fs: FsUsage): number {
  const capacity = fs.usedBytes + fs.availBytes;
  return capacity > 0 ? (fs.usedBytes / capacity) * 100 : 0;
}

/**
 * Bytes to free to bring the filesystem from above `high` down to `low`
 * (the kubelet's image GC); 0 while it is at or under `high`.
 */
export function watermarkExcess(fs: FsUsage, wm: Watermark): number {
  if (usedPercent(fs) <= wm.high) return 0;
  const capacity = fs.usedBytes + fs.availBytes;
  return Math.max(0, Math.ceil(fs.usedBytes - (wm.low / 100) * capacity));
}

/**
 * The size the cache must get down to: the tighter of --max-size and what
 * the watermark asks to shed; null when nothing limits it.
 */
export function cacheTarget(totalBytes: number, maxSizeBytes: number | undefined, excessBytes: number): number | null {
  const targets: number[] = [];
  if (maxSizeBytes !== undefined) targets.push(maxSizeBytes);
  if (excessBytes > 0) targets.push(Math.max(0, totalBytes - excessBytes));
  return targets.length ? Math.min(...targets) : null;
}

/** When an entry was last used; one never used counts from when it was made. */
type Dated = Pick<GcEntry, "id" | "state" | "lastUsedMs" | "createdMs">;

export function lastUseOf(entry: Dated): number {
  return entry.lastUsedMs || entry.createdMs;
}

/** Ready entries, least recently used first (ties: older first, then by id, so runs are repeatable). */
export function lruOrder<T extends Dated>(entries: T[]): T[] {
  return entries.filter((e) => e.state === "ready").sort((a, b) => lastUseOf(a) - lastUseOf(b) || a.createdMs - b.createdMs || a.id.localeCompare(b.id));
}

export interface Protection {
  now: number;
  minAgeMs: number;
  /** Id prefixes never to remove (--keep). */
  keep: string[];
}

/** What the policy itself protects: kept keys, and entries too new to judge. In-use checks come from the entry. */
export function protectedBy(entry: GcEntry, p: Protection): SkipReason[] {
  const reasons: SkipReason[] = [];
  // Keys and ids are lowercase hex (an image id with or without sha256:); image references as written.
  const id = entry.id.replace(/^sha256:/, "");
  const kept = p.keep.find((k) => {
    const prefix = k.toLowerCase().replace(/^sha256:/, "");
    return (prefix !== "" && id.startsWith(prefix)) || entry.names?.some((n) => n.startsWith(k));
  });
  if (kept !== undefined) reasons.push({ code: "keep", message: `kept (--keep ${kept})` });
  const age = p.now - entry.createdMs;
  if (age < p.minAgeMs) reasons.push({ code: "min-age", message: `younger than the minimum age of ${formatDuration(p.minAgeMs)} (${Math.max(0, Math.round(age / 1000))}s old; --min-age sets it)` });
  return reasons;
}
