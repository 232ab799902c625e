import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { tryLock } from "../core/lock.ts";
import type { GcLimits } from "./limits.ts";
import { cacheTarget, type FsUsage, fsUsage, lruOrder, protectedBy, usedPercent, watermarkExcess } from "./policy.ts";
import type { EngineEnv } from "../docker/engine.ts";
import { refuseLinkedFolders } from "./home-links.ts";
import { gcSources } from "./sources.ts";
import { sweepTrash, type TrashReport } from "./trash.ts";
import type { GcEntry, GcKind, GcSource, GcState, SkipReason } from "./types.ts";

export interface GcOptions extends GcLimits {
  dryRun: boolean;
  /** Measure every entry's size again instead of trusting recorded sizes. */
  refreshSizes: boolean;
  /** The container engine CLI's environment (for the images gpulayer pulled). */
  engineEnv: EngineEnv;
  /** For tests and benchmarks: other sources, a fixed clock, a fake filesystem. */
  sources?: GcSource[];
  now?: number;
  fsUsage?: (path: string) => FsUsage;
}

export interface GcItem {
  kind: GcKind;
  id: string;
  state: GcState;
  sizeBytes: number;
  lastUsed: string | null;
  created: string | null;
  summary: string;
  /** Images: the engine and the references gpulayer recorded for it. */
  image?: { engine: string; refs: string[]; digest: string };
}

export interface GcReport {
  /** false when another gc held the cache: nothing was done. */
  ran: boolean;
  dryRun: boolean;
  limit: {
    maxSizeBytes: number | null;
    origin: string | null;
    watermark: { high: number; low: number; path: string; usedPercent: number; excessBytes: number } | null;
    minAgeSeconds: number;
    keep: string[];
  };
  /** The total the cache had to get down to; null without any limit. */
  targetBytes: number | null;
  /** Entries counted in the total (images gpulayer did not pull are not: they are listed in `skipped`). */
  entries: number;
  totalBeforeBytes: number;
  totalAfterBytes: number;
  /** Entries removed plus interrupted deletions finished. */
  freedBytes: number;
  /** `image`: an env built on top of an image this run removed. */
  removed: (GcItem & { reason: "lru" | "incomplete" | "image" })[];
  skipped: (GcItem & { reasons: SkipReason[] })[];
  trash: TrashReport;
  limitReached: boolean;
  sizesRefreshed: number;
  seconds: number;
}

const iso = (ms: number) => (ms ? new Date(ms).toISOString() : null);

function item(e: GcEntry): GcItem {
  const base: GcItem = { kind: e.kind, id: e.id, state: e.state, sizeBytes: e.sizeBytes, lastUsed: iso(e.lastUsedMs), created: iso(e.createdMs), summary: e.summary };
  return e.image ? { ...base, image: e.image } : base;
}

/** The lock that keeps two gc runs from working on one cache at once. */
export function gcLockPath(layout: HomeLayout): string {
  return join(layout.locks, "gc");
}

/**
 * One gc pass: finish interrupted deletions, remove remains of dead builds,
 * then remove ready entries least recently used first until the cache fits
 * its limit, skipping what is kept, too new, leased or locked. --dry-run
 * decides the same way and changes nothing.
 */
export async function runGc(layout: HomeLayout, opts: GcOptions): Promise<GcReport> {
  const started = performance.now();
  const now = opts.now ?? Date.now();
  const report: GcReport = {
    ran: true,
    dryRun: opts.dryRun,
    limit: { maxSizeBytes: opts.maxSize?.bytes ?? null, origin: opts.maxSize?.origin ?? null, watermark: null, minAgeSeconds: opts.minAgeMs / 1000, keep: opts.keep },
    targetBytes: null,
    entries: 0,
    totalBeforeBytes: 0,
    totalAfterBytes: 0,
    freedBytes: 0,
    removed: [],
    skipped: [],
    trash: { finished: 0, freedBytes: 0 },
    limitReached: true,
    sizesRefreshed: 0,
    seconds: 0,
  };
  // Before anything is read or locked: a linked folder would take gc out of its home.
  refuseLinkedFolders(layout);
  // A dry run changes nothing, so it needs no exclusion; a real run does.
  const release = opts.dryRun ? null : await tryLock(gcLockPath(layout));
  if (!opts.dryRun && !release) return { ...report, ran: false, limitReached: false, seconds: (performance.now() - started) / 1000 };
  try {
    report.trash = sweepTrash(layout, { dryRun: opts.dryRun, now });
    const listed: GcEntry[] = [];
    for (const source of opts.sources ?? gcSources(layout, opts.engineEnv)) listed.push(...(await source.list({ refreshSizes: opts.refreshSizes, persistSizes: !opts.dryRun })));
    // Not gc's to remove (images gpulayer did not pull): reported, never counted.
    const excluded = listed.filter((e) => e.excluded);
    const entries = listed.filter((e) => !e.excluded);
    report.entries = entries.length;
    report.sizesRefreshed = entries.filter((e) => e.sizeRefreshed).length;
    report.totalBeforeBytes = entries.reduce((sum, e) => sum + e.sizeBytes, 0);
    let current = report.totalBeforeBytes;

    let excess = 0;
    if (opts.watermark) {
      const fs = (opts.fsUsage ?? fsUsage)(layout.root);
      // A dry run has not emptied the trash; what that would free counts as freed.
      excess = Math.max(0, watermarkExcess(fs, opts.watermark) - (opts.dryRun ? report.trash.freedBytes : 0));
      report.limit.watermark = { ...opts.watermark, path: fs.path, usedPercent: Number(usedPercent(fs).toFixed(2)), excessBytes: excess };
    }
    const target = cacheTarget(current, opts.maxSize?.bytes, excess);
    report.targetBytes = target;

    const remove = async (e: GcEntry, reason: "lru" | "incomplete" | "image"): Promise<boolean> => {
      if (opts.dryRun) {
        const reasons = e.state === "ready" ? await e.inUse() : [];
        if (reasons.length) {
          report.skipped.push({ ...item(e), reasons });
          return false;
        }
        report.removed.push({ ...item(e), reason });
        current -= e.sizeBytes;
        return true;
      }
      const outcome = await e.remove();
      if (!outcome.removed) {
        // An incomplete entry that finished building meanwhile, or one another process removed, is no skip worth reporting.
        if (outcome.reason.code !== "changed") report.skipped.push({ ...item(e), reasons: [outcome.reason] });
        return false;
      }
      report.removed.push({ ...item(e), sizeBytes: outcome.freedBytes, reason });
      current -= outcome.freedBytes;
      return true;
    };

    // Remains of dead builds are garbage whatever the limit (their lock was free when listed; remove() takes it).
    for (const e of entries) {
      if (e.state !== "incomplete") continue;
      const kept = protectedBy(e, { now, minAgeMs: 0, keep: opts.keep });
      if (kept.length) report.skipped.push({ ...item(e), reasons: kept });
      else await remove(e, "incomplete");
    }

    if (target !== null) {
      const protection = { now, minAgeMs: opts.minAgeMs, keep: opts.keep };
      for (const e of lruOrder(entries)) {
        if (current <= target) break;
        const reasons = protectedBy(e, protection);
        if (reasons.length) {
          report.skipped.push({ ...item(e), reasons });
          continue;
        }
        await remove(e, "lru");
      }
      // Never a candidate while its build runs (its size is not walked either): said, so a limit not met is explained.
      for (const e of entries) if (e.state === "building") report.skipped.push({ ...item(e), reasons: [{ code: "locked", message: "being built now" }] });
    }
    // An env on top of an image is of no use without it: it goes with the image (unless kept or leased).
    const goneImages = new Set(report.removed.filter((r) => r.kind === "image").map((r) => r.id));
    for (const e of entries) {
      if (!e.onImage || !goneImages.has(e.onImage) || report.removed.some((r) => r.kind === e.kind && r.id === e.id)) continue;
      const kept = protectedBy(e, { now, minAgeMs: 0, keep: opts.keep });
      if (kept.length) report.skipped.push({ ...item(e), reasons: kept });
      else await remove(e, "image");
    }
    for (const e of excluded) report.skipped.push({ ...item(e), reasons: [e.excluded!] });
    report.totalAfterBytes = current;
    // Both limits must hold: the size limit, and the watermark's bytes actually freed (other files may fill the disk).
    report.limitReached = (opts.maxSize === undefined || current <= opts.maxSize.bytes) && report.totalBeforeBytes - current >= excess;
    report.freedBytes = report.totalBeforeBytes - current + report.trash.freedBytes;
    report.seconds = (performance.now() - started) / 1000;
    return report;
  } finally {
    await release?.();
  }
}
