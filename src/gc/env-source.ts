import { existsSync, mkdirSync, readFileSync, renameSync, statSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { liveLeases } from "../core/lease.ts";
import { isLocked, tryLock } from "../core/lock.ts";
import { writeFileAtomic } from "../core/atomic.ts";
import { removeTree } from "../core/tree-owner.ts";
import { diskUsage, type EntryPaths, type EnvMeta, entryPaths, isReady, listKeys, orphanTmpKeys } from "../env/index-light.ts";
import { isLink } from "./home-links.ts";
import { changedSince } from "./sizes.ts";
import type { GcEntry, GcSource, GcState, ListOptions, RemoveOutcome, SkipReason } from "./types.ts";

/** meta.json as gc keeps it: the build's own fields, plus when gc last measured the size. */
type SizedMeta = EnvMeta & { sizeMeasuredMs?: number };

function statMs(path: string): number | null {
  try {
    return statSync(path).mtimeMs;
  } catch {
    return null;
  }
}

function readSizedMeta(paths: EntryPaths): SizedMeta | null {
  try {
    return JSON.parse(readFileSync(paths.meta, "utf8")) as SizedMeta;
  } catch {
    return null;
  }
}

/** Python environments in envs-v1/, offered to the gc policy. */
export function envSource(layout: HomeLayout): GcSource {
  return { kind: "env", list: (opts) => listEnvEntries(layout, opts) };
}

async function listEnvEntries(layout: HomeLayout, opts: ListOptions): Promise<GcEntry[]> {
  const entries: GcEntry[] = [];
  for (const key of listKeys(layout)) {
    const paths = entryPaths(layout, key);
    if (isLink(paths.dir)) {
      // gpulayer never makes an entry a link: it is garbage, and only the link goes (nothing is read or written through it).
      entries.push(envEntry(layout, paths, { state: "incomplete", sizeBytes: 0, lastUsedMs: 0, createdMs: 0, summary: "a symbolic link, not an environment (only the link is removed)" }));
      continue;
    }
    const readyMs = statMs(paths.ready);
    if (readyMs === null) {
      const dirMs = statMs(paths.dir);
      if (dirMs === null) continue; // removed under us
      const building = await isLocked(paths.lock);
      // Remains of a dead build are measured (they are few, and about to go); a build in progress is not walked.
      // Its installers' temporary folder goes with it (removeEnvEntry): counted with it.
      const tmpBytes = !building && statMs(paths.tmp) !== null ? diskUsage(paths.tmp) : 0;
      entries.push(envEntry(layout, paths, { state: building ? "building" : "incomplete", sizeBytes: building ? 0 : diskUsage(paths.dir) + tmpBytes, lastUsedMs: 0, createdMs: dirMs, summary: "" }));
      continue;
    }
    const meta = readSizedMeta(paths);
    const createdMs = (meta && Date.parse(meta.created)) || readyMs;
    let sizeBytes = meta?.sizeBytes ?? -1;
    // A size recorded at build time was measured before the ready marker was written.
    const measuredMs = meta?.sizeMeasuredMs ?? readyMs;
    let sizeRefreshed = false;
    if (sizeBytes < 0 || opts.refreshSizes || changedSince(paths.dir, measuredMs)) {
      const started = Date.now();
      sizeBytes = diskUsage(paths.dir);
      sizeRefreshed = true;
      if (opts.persistSizes && meta) await persistSize(paths, meta, sizeBytes, started);
    }
    const onImage = (meta?.request as { image?: unknown } | undefined)?.image;
    entries.push(envEntry(layout, paths, { state: "ready", sizeBytes, lastUsedMs: statMs(paths.lastUsed) ?? 0, createdMs, summary: meta?.summary ?? "", sizeRefreshed, ...(typeof onImage === "string" ? { onImage } : {}) }));
  }
  // What the installers of a build killed before it made its folder left in their TMPDIR: remains too.
  for (const key of orphanTmpKeys(layout)) {
    const paths = entryPaths(layout, key);
    const tmpMs = statMs(paths.tmp);
    if (tmpMs === null) continue;
    const building = await isLocked(paths.lock);
    entries.push(envEntry(layout, paths, { state: building ? "building" : "incomplete", sizeBytes: building ? 0 : diskUsage(paths.tmp), lastUsedMs: 0, createdMs: tmpMs, summary: "" }));
  }
  return entries;
}

/** Record a size measured again, under the entry's lock so it cannot land in a rebuilt entry's meta. */
async function persistSize(paths: EntryPaths, meta: SizedMeta, sizeBytes: number, measuredMs: number): Promise<void> {
  const release = await tryLock(paths.lock);
  if (!release) return;
  try {
    if (!isReady(paths) || readSizedMeta(paths)?.created !== meta.created) return;
    writeFileAtomic(paths.meta, JSON.stringify({ ...meta, sizeBytes, sizeMeasuredMs: measuredMs }, null, 2));
  } catch {
    // best effort: the next gc measures again
  } finally {
    await release();
  }
}

type EntryFacts = Pick<GcEntry, "state" | "sizeBytes" | "lastUsedMs" | "createdMs" | "summary" | "sizeRefreshed" | "onImage">;

function leaseReason(holders: string[]): SkipReason {
  return { code: "leased", message: `in use by ${holders.join(", ")}` };
}

function envEntry(layout: HomeLayout, paths: EntryPaths, facts: EntryFacts): GcEntry {
  const key = paths.dir.split("/").pop()!;
  return {
    kind: "env",
    id: key,
    ...facts,
    async inUse() {
      const reasons: SkipReason[] = [];
      const holders = liveLeases(layout, "env", key);
      if (holders.length) reasons.push(leaseReason(holders));
      if (await isLocked(paths.lock)) reasons.push({ code: "locked", message: "locked by a build or a removal in progress" });
      return reasons;
    },
    remove: () => removeEnvEntry(layout, paths, key, facts),
  };
}

/**
 * Remove one environment without ever racing a build or a job.
 *
 * A job takes its lease BEFORE it looks for the ready marker (prepare.ts), and
 * a build holds the entry's lock from before it creates the folder until after
 * the ready marker is written. So, in this order:
 *   1. take the entry's build lock, non-blocking: held means a build (or
 *      another removal) is at work, and the entry is skipped;
 *   2. check the leases: a live one means a job uses it, skip;
 *   3. rename the folder into trash: atomic, so from now on nobody can find
 *      the entry, and nobody ever sees it half deleted;
 *   4. check the leases AGAIN: a job that leased between 2 and 3 may already
 *      have seen the ready marker and be about to run from the env; if so,
 *      rename the folder back, whole, before the lock is released. A job
 *      that leases after 3 finds no marker and waits on the lock we hold;
 *      when we release it, it finds the entry back (4) or builds it afresh;
 *   5. release the lock, then delete the renamed folder at leisure. A crash
 *      here leaves a trash item that the next gc deletes (trash.ts); nothing
 *      in envs-v1/ ever carries a ready marker over a partial env.
 */
async function removeEnvEntry(layout: HomeLayout, paths: EntryPaths, key: string, facts: EntryFacts): Promise<RemoveOutcome> {
  const release = await tryLock(paths.lock);
  if (!release) return { removed: false, reason: { code: "locked", message: facts.state === "ready" ? "locked by a build or a removal in progress" : "being built (its lock is held)" } };
  let doomed: string;
  let doomedTmp: string | null = null;
  try {
    const linked = isLink(paths.dir);
    // Never through a link: its target is not the home's (renaming the link moves only the link).
    const ready = !linked && isReady(paths);
    // The installers' temporary folder exists only while a build holds the lock: any other is a dead build's.
    if (existsSync(paths.tmp)) {
      mkdirSync(layout.trash, { recursive: true });
      doomedTmp = join(layout.trash, `${key}.tmp.${process.pid}.${Date.now()}`);
      renameSync(paths.tmp, doomedTmp);
    }
    if (!linked && statMs(paths.dir) === null) {
      // Only the temporary folder of a build killed before it made its own was left.
      if (facts.state === "incomplete" && doomedTmp) return { removed: true, freedBytes: facts.sizeBytes };
      return { removed: false, reason: { code: "changed", message: "already removed by another process" } };
    }
    if (facts.state === "incomplete" && ready) return { removed: false, reason: { code: "changed", message: "finished building meanwhile" } };
    if (facts.state === "ready") {
      if (!ready) return { removed: false, reason: { code: "changed", message: "no longer ready" } };
      const holders = liveLeases(layout, "env", key);
      if (holders.length) return { removed: false, reason: leaseReason(holders) };
    }
    mkdirSync(layout.trash, { recursive: true });
    doomed = join(layout.trash, `${key}.${process.pid}.${Date.now()}`);
    renameSync(paths.dir, doomed);
    if (facts.state === "ready") {
      const late = liveLeases(layout, "env", key);
      if (late.length) {
        renameSync(doomed, paths.dir);
        return { removed: false, reason: { code: "leased", message: `in use by ${late.join(", ")} (leased while gc was removing it; put back)` } };
      }
    }
  } finally {
    await release();
    // A worker.run_as build's trees are its user's: closed before rm walks them (core/tree-owner.ts).
    if (doomedTmp) removeTree(doomedTmp);
  }
  removeTree(doomed);
  return { removed: true, freedBytes: facts.sizeBytes };
}
