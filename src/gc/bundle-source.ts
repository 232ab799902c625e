import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { type BundlePaths, bundlePaths, type HomeLayout } from "../config/paths.ts";
import { isLocked, tryLock } from "../core/lock.ts";
import { liveLeases } from "../core/lease.ts";
import { diskUsage } from "../env/index-light.ts";
import type { GcEntry, GcSource, RemoveOutcome, SkipReason } from "./types.ts";

/**
 * The copies of remote jobs' bundles a worker keeps (`gpulayer join`,
 * worker/tasks.ts) under cluster/bundles/: `<hash>.tar.gz` as fetched, and
 * `<hash>/`, the same unpacked, counted and removed together as one entry,
 * with `<hash>.last-used` (its mtime is the last use; the tar.gz's mtime, the
 * fetch, stands in for a copy never touched since).
 *
 * A task takes a lease on the copy (kind "bundle", id the hash) before it
 * looks, and looks and fetches only holding the entry's lock; gc removes
 * under that same lock, checking the leases before and after moving the
 * files out (as env-source.ts does), so no task ever finds half a copy.
 */
export function bundleSource(layout: HomeLayout): GcSource {
  return { kind: "bundle", list: async () => listBundleEntries(layout) };
}

function statMs(path: string): number | null {
  try {
    return statSync(path).mtimeMs;
  } catch {
    return null;
  }
}

const leaseReason = (holders: string[], late = false): SkipReason => ({ code: "leased", message: `in use by ${holders.join(", ")}${late ? " (leased while gc was removing it; put back)" : ""}` });
const lockedReason: SkipReason = { code: "locked", message: "locked by a task fetching it or a removal in progress" };

async function listBundleEntries(layout: HomeLayout): Promise<GcEntry[]> {
  let names: string[];
  try {
    names = readdirSync(layout.clusterBundles);
  } catch {
    return [];
  }
  // Only finished copies: `<hash>.tar.gz` and `<hash>/` (a task's `.tmp` files are its own).
  const hashes = new Set(names.map((n) => /^([0-9a-f]{64})(\.tar\.gz)?$/.exec(n)?.[1]).filter((h): h is string => h !== undefined));
  const entries: GcEntry[] = [];
  for (const hash of [...hashes].sort()) {
    const paths = bundlePaths(layout, hash);
    const createdMs = statMs(paths.file) ?? statMs(paths.dir);
    if (createdMs === null) continue; // removed under us
    const sizeBytes = diskUsage(paths.file) + diskUsage(paths.dir) + diskUsage(paths.lastUsed);
    entries.push(bundleEntry(layout, paths, { sizeBytes, createdMs, lastUsedMs: statMs(paths.lastUsed) ?? createdMs }));
  }
  return entries;
}

type Facts = Pick<GcEntry, "sizeBytes" | "createdMs" | "lastUsedMs">;

function bundleEntry(layout: HomeLayout, paths: BundlePaths, facts: Facts): GcEntry {
  return {
    kind: "bundle",
    id: paths.hash,
    state: "ready",
    ...facts,
    summary: "remote job bundle (worker copy)",
    async inUse() {
      const reasons: SkipReason[] = [];
      const holders = liveLeases(layout, "bundle", paths.hash);
      if (holders.length) reasons.push(leaseReason(holders));
      if (await isLocked(paths.lock)) reasons.push(lockedReason);
      return reasons;
    },
    remove: () => removeBundle(layout, paths, facts),
  };
}

/**
 * Holding the entry's lock (so no task is looking or fetching): check the
 * leases, move the parts into one trash item, check the leases again and put
 * everything back if a task leased meanwhile; delete after the lock is let go.
 */
async function removeBundle(layout: HomeLayout, paths: BundlePaths, facts: Facts): Promise<RemoveOutcome> {
  const release = await tryLock(paths.lock);
  if (!release) return { removed: false, reason: lockedReason };
  let doomed: string;
  try {
    const parts = [paths.file, paths.dir, paths.lastUsed].filter((p) => existsSync(p));
    if (!parts.some((p) => p !== paths.lastUsed)) return { removed: false, reason: { code: "changed", message: "already removed by another process" } };
    const holders = liveLeases(layout, "bundle", paths.hash);
    if (holders.length) return { removed: false, reason: leaseReason(holders) };
    doomed = join(layout.trash, `bundle-${paths.hash}.${process.pid}.${Date.now()}`);
    mkdirSync(doomed, { recursive: true });
    const moved: string[] = [];
    const putBack = () => {
      for (const p of moved) renameSync(join(doomed, basename(p)), p);
    };
    try {
      for (const p of parts) {
        renameSync(p, join(doomed, basename(p)));
        moved.push(p);
      }
    } catch (error) {
      putBack();
      rmSync(doomed, { recursive: true, force: true });
      return { removed: false, reason: { code: "failed", message: `could not move it out: ${(error as Error).message}` } };
    }
    const late = liveLeases(layout, "bundle", paths.hash);
    if (late.length) {
      putBack();
      rmSync(doomed, { recursive: true, force: true });
      return { removed: false, reason: leaseReason(late, true) };
    }
  } finally {
    await release();
  }
  rmSync(doomed, { recursive: true, force: true });
  return { removed: true, freedBytes: facts.sizeBytes };
}
