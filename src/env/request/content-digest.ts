import { existsSync, mkdirSync, readdirSync, readFileSync, type Stats, statSync } from "node:fs";
import { join } from "node:path";
import { writeFileAtomic } from "../../core/atomic.ts";
import { contentHash, fileContentHash } from "../../core/hashing.ts";

/**
 * Local inputs by content: files and find-links folders (project folders:
 * tree-digest.ts). A stat cache (path, size, mtime, ctime, inode → sha256, as
 * git's index) keeps the warm path to a stat per file. An entry is trusted only when the file was
 * last changed well before it was recorded: a write within the same clock
 * tick as the recording would otherwise go unseen (git's "racily clean").
 */

export const RACY_MS = 2_000;

/** size, mtime, ctime, inode, device: compared as numbers (formatting floats per file costs more than the stat). */
type Signature = [number, number, number, number, number];
type Entry = [...Signature, string];
const sameFile = (e: Entry, s: Stats): boolean => e[0] === s.size && e[1] === s.mtimeMs && e[2] === s.ctimeMs && e[3] === s.ino && e[4] === s.dev;

/** Told before a big file is read for its digest (once: later runs have its stat): a key can take seconds on a wheelhouse. */
export type OnHashing = (path: string, bytes: number) => void;

/** Files at least this big are told of before they are hashed. */
const TOLD_BYTES = 64 * 1024 * 1024;

/** One cache file per root; loaded on first use, written back only when something changed. */
export class DigestCache {
  private loaded: Record<string, Entry> | null = null;
  private dirty = false;
  private readonly file: string | null;

  constructor(
    dir: string | null,
    root: string,
    private readonly now: () => number = Date.now,
    private readonly onHashing?: OnHashing,
  ) {
    this.file = dir ? join(dir, `${contentHash(root).slice(0, 32)}.json`) : null;
  }

  private get entries(): Record<string, Entry> {
    if (this.loaded) return this.loaded;
    this.loaded = {};
    if (this.file) {
      try {
        this.loaded = JSON.parse(readFileSync(this.file, "utf8"));
      } catch {
        // none yet, or unreadable: rebuilt as files are hashed
      }
    }
    return this.loaded!;
  }

  /** `id` names the file within this cache's root (shorter than its path: the cache is read on every warm run). */
  digest(path: string, stat: Stats, id: string = path): string {
    const hit = this.entries[id];
    if (Array.isArray(hit) && sameFile(hit, stat)) return hit[5];
    if (stat.size >= TOLD_BYTES) this.onHashing?.(path, stat.size);
    const digest = fileContentHash(path);
    if (this.now() - Math.max(stat.mtimeMs, stat.ctimeMs) > RACY_MS) {
      this.entries[id] = [stat.size, stat.mtimeMs, stat.ctimeMs, stat.ino, stat.dev, digest];
      this.dirty = true;
    }
    return digest;
  }

  save(): void {
    if (!this.file || !this.dirty) return;
    try {
      mkdirSync(join(this.file, ".."), { recursive: true });
      writeFileAtomic(this.file, JSON.stringify(this.entries));
    } catch {
      // a cache that cannot be written only costs the next run a rehash
    }
  }
}

/** One file (a wheel, an sdist) by content. */
export function fileDigest(path: string, cacheDir: string | null, onHashing?: OnHashing): string {
  const cache = new DigestCache(cacheDir, path, Date.now, onHashing);
  const digest = cache.digest(path, statSync(path));
  cache.save();
  return digest;
}

/** A find-links location on disk: a folder by its files, a file by its bytes, "missing" when absent (pip warns and goes on). */
export function findLinksDigest(path: string, cacheDir: string | null, onHashing?: OnHashing): string {
  const stat = statSync(path, { throwIfNoEntry: false });
  if (!stat) return "missing";
  return stat.isDirectory() ? folderDigest(path, cacheDir, onHashing) : fileDigest(path, cacheDir, onHashing);
}

/** A local find-links folder: the names and content of what pip would pick from (its files; pip does not descend). */
export function folderDigest(dir: string, cacheDir: string | null, onHashing?: OnHashing): string {
  const cache = new DigestCache(cacheDir, `folder:${dir}`, Date.now, onHashing);
  const hasher = new Bun.CryptoHasher("sha256");
  if (existsSync(dir)) {
    for (const name of readdirSync(dir).sort()) {
      const path = join(dir, name);
      let stat: Stats;
      try {
        stat = statSync(path);
      } catch {
        continue;
      }
      hasher.update(stat.isFile() ? `file\0${name}\0${cache.digest(path, stat, name)}\0` : `other\0${name}\0`);
    }
  } else hasher.update("missing");
  cache.save();
  return hasher.digest("hex");
}
