import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { diskUsage } from "../env/index-light.ts";
import { namesOfDeadOwners } from "../core/dead-owners.ts";
import { leftWorkdirs } from "./workdirs.ts";
import { contentHash } from "../core/hashing.ts";
import type { RemoveOutcome } from "./types.ts";

/**
 * Trash items are named `<id>.<pid>.<ms>` by whoever renamed them there
 * (store.ts removeEntryDir, gc itself). An item whose process is alive is
 * being deleted right now and is left to it (two deleters racing over one
 * tree make each other fail); any other item is the remains of a deletion a
 * crash interrupted, and gc finishes it.
 */
const DAY_MS = 86_400_000;

/** Alive, and not a zombie (a killed process its parent has not reaped yet deletes nothing). */
function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "EPERM") return false;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return !/^[ZX]/.test(stat.slice(stat.lastIndexOf(")") + 2));
  } catch {
    return true; // no /proc: trust kill(0)
  }
}

function abandoned(name: string, now: number): boolean {
  const m = /\.(\d+)\.(\d+)$/.exec(name);
  if (!m) return true;
  const pid = Number(m[1]);
  const since = Number(m[2]);
  // A pid reused by some long-lived process must not pin trash forever.
  return pid === process.pid || !pidAlive(pid) || now - since > DAY_MS;
}

export interface TrashReport {
  /** Interrupted deletions finished (or, with dryRun, that would be). */
  finished: number;
  freedBytes: number;
}

export function sweepTrash(layout: HomeLayout, opts: { dryRun: boolean; now?: number }): TrashReport {
  const report: TrashReport = { finished: 0, freedBytes: 0 };
  sweepLockLeftovers(layout, opts.dryRun, report);
  sweepLeftWorkdirs(layout, opts.dryRun, report);
  let names: string[];
  try {
    names = readdirSync(layout.trash);
  } catch {
    return report;
  }
  const now = opts.now ?? Date.now();
  for (const name of names) if (abandoned(name, now)) removeCounted(join(layout.trash, name), opts.dryRun, report);
  return report;
}

/** Remove one leftover (or, dry, only count it); one that cannot be removed (another deleter got there first, a permission problem) is left to the next gc. */
function removeCounted(path: string, dryRun: boolean, report: TrashReport): void {
  const size = diskUsage(path);
  if (!dryRun) {
    try {
      rmSync(path, { recursive: true, force: true });
    } catch {
      return;
    }
  }
  report.finished++;
  report.freedBytes += size;
}

/** A lock being made, broken or released (`NAME.lock.PID-RAND.tmp|stale|released`, core/lock.ts) by a process that is gone. */
const LOCK_LEFTOVER = /\.lock\.(\d+)-[a-z0-9]+\.(tmp|stale|released)$/;

/** What a lock's maker left when it died (or its disk filled) mid-way: never a lock, only its remains. */
function sweepLockLeftovers(layout: HomeLayout, dryRun: boolean, report: TrashReport): void {
  for (const name of namesOfDeadOwners(layout.locks, LOCK_LEFTOVER)) removeCounted(join(layout.locks, name), dryRun, report);
}

/** A killed worker's jobs' workdirs, whose deletion its tasks never reached (workdirs.ts says which). */
function sweepLeftWorkdirs(layout: HomeLayout, dryRun: boolean, report: TrashReport): void {
  for (const path of leftWorkdirs(layout)) removeCounted(path, dryRun, report);
}

/**
 * A folder gc may take at any time (no lease, no lock: a wheel of the
 * wheelhouse, a bucket of the bytecode store) out of the cache: one rename
 * into the trash, named as above, then deleted.
 */
export function removeIntoTrash(layout: HomeLayout, dir: string, kind: string): RemoveOutcome {
  const sizeBytes = diskUsage(dir);
  const doomed = join(layout.trash, `${kind}-${contentHash(dir).slice(0, 16)}.${process.pid}.${Date.now()}`);
  try {
    mkdirSync(layout.trash, { recursive: true });
    renameSync(dir, doomed);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return { removed: false, reason: { code: "changed", message: "already removed by another process" } };
    return { removed: false, reason: { code: "failed", message: `could not move it out: ${(error as Error).message}` } };
  }
  rmSync(doomed, { recursive: true, force: true });
  return { removed: true, freedBytes: sizeBytes };
}
