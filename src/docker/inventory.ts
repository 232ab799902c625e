import { createHash } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { writeFileAtomic } from "../core/atomic.ts";
import { touchFile } from "../env/index-light.ts";
import type { EngineName } from "./engine.ts";

/**
 * gpulayer's own record of the images it uses, since neither engine tracks
 * last use: $GPULAYER_HOME/images-v1/<id>/{meta.json,last-used}, one per
 * engine and reference. `last-used` is a touched file whose mtime is the
 * time of last use (as for envs); gc removes only records marked
 * `pulledByGpulayer`, least recently used first. A record is written only
 * after a pull and an inspect both succeeded: nothing half-recorded.
 */
export interface ImageRecord {
  schema: 1;
  engine: EngineName;
  /** The reference as asked for (e.g. registry/org/img:tag). */
  ref: string;
  /** The manifest digest (sha256:...) from RepoDigests, else the image id. */
  digest: string;
  /** The local image id: what containers are started from. */
  imageId: string;
  repoDigests: string[];
  sizeBytes: number;
  firstSeen: string;
  /** The last time gpulayer pulled it (absent when it never did). */
  lastPulled?: string;
  /** True only when gpulayer's own pull brought this image onto the machine. */
  pulledByGpulayer: boolean;
  /** Podman's image store as it was just before the answer this record holds (podman-store.ts): while it is the same, so is the answer. */
  storeStamp?: string;
}

export interface RecordPaths {
  id: string;
  dir: string;
  meta: string;
  lastUsed: string;
  lock: string;
}

export function recordId(engine: EngineName, ref: string): string {
  return createHash("sha256").update(`${engine}\0${ref}`).digest("hex");
}

export function recordPaths(layout: HomeLayout, engine: EngineName, ref: string): RecordPaths {
  const id = recordId(engine, ref);
  const dir = join(layout.images, id);
  return { id, dir, meta: join(dir, "meta.json"), lastUsed: join(dir, "last-used"), lock: join(layout.locks, `image-${id}`) };
}

export function readRecord(paths: RecordPaths): ImageRecord | null {
  try {
    const data = JSON.parse(readFileSync(paths.meta, "utf8")) as ImageRecord;
    return data.schema === 1 ? data : null;
  } catch {
    return null;
  }
}

/** Meta first, then last-used: a record is listed only once its meta is whole (atomic write). */
export function writeRecord(paths: RecordPaths, record: ImageRecord): void {
  mkdirSync(paths.dir, { recursive: true });
  writeFileAtomic(paths.meta, `${JSON.stringify(record, null, 2)}\n`);
  touchRecord(paths);
}

export function touchRecord(paths: RecordPaths, when = new Date()): void {
  touchFile(paths.lastUsed, when);
}

export function recordLastUsedMs(paths: RecordPaths): number {
  try {
    return statSync(paths.lastUsed).mtimeMs;
  } catch {
    return 0;
  }
}

export interface ImageEntry extends ImageRecord {
  id: string;
  dir: string;
  lastUsed: string | null;
}

/** All records, most recently used first (for `gc` and listings). */
export function listImageRecords(layout: HomeLayout): ImageEntry[] {
  let names: string[];
  try {
    names = readdirSync(layout.images).filter((n) => /^[0-9a-f]{64}$/.test(n));
  } catch {
    return [];
  }
  const entries: ImageEntry[] = [];
  for (const id of names) {
    const dir = join(layout.images, id);
    const paths: RecordPaths = { id, dir, meta: join(dir, "meta.json"), lastUsed: join(dir, "last-used"), lock: join(layout.locks, `image-${id}`) };
    const record = readRecord(paths);
    if (!record) continue;
    const used = recordLastUsedMs(paths);
    entries.push({ ...record, id, dir, lastUsed: used ? new Date(used).toISOString() : null });
  }
  return entries.sort((a, b) => (b.lastUsed ?? "").localeCompare(a.lastUsed ?? ""));
}
