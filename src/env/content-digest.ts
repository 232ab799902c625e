import { existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, type Stats, statSync } from "node:fs";
import { join, relative } from "node:path";
import ignore, { type Ignore } from "ignore";
import { writeFileAtomic } from "../core/atomic.ts";
import { contentHash } from "../core/hashing.ts";

/**
 * Local inputs by content: files, project folders, find-links folders. A stat
 * cache (path, size, mtime, ctime, inode → sha256, as git's index) keeps the
 * warm path to a stat per file. An entry is trusted only when the file was
 * last changed well before it was recorded: a write within the same clock
 * tick as the recording would otherwise go unseen (git's "racily clean").
 */

const RACY_MS = 2_000;

/** size, mtime, ctime, inode, device: compared as numbers (formatting floats per file costs more than the stat). */
type Signature = [number, number, number, number, number];
type Entry = [...Signature, string];
const sameFile = (e: Entry, s: Stats): boolean => e[0] === s.size && e[1] === s.mtimeMs && e[2] === s.ctimeMs && e[3] === s.ino && e[4] === s.dev;

/** One cache file per root; loaded once, written back only when something changed. */
export class DigestCache {
  private entries: Record<string, Entry> = {};
  private dirty = false;
  private readonly file: string | null;

  constructor(
    dir: string | null,
    root: string,
    private readonly now: () => number = Date.now,
  ) {
    this.file = dir ? join(dir, `${contentHash(root).slice(0, 32)}.json`) : null;
    if (!this.file) return;
    try {
      this.entries = JSON.parse(readFileSync(this.file, "utf8"));
    } catch {
      // none yet, or unreadable: rebuilt as files are hashed
    }
  }

  /** `id` names the file within this cache's root (shorter than its path: the cache is read on every warm run). */
  digest(path: string, stat: Stats, id: string = path): string {
    const hit = this.entries[id];
    if (Array.isArray(hit) && sameFile(hit, stat)) return hit[5];
    const digest = contentHash(readFileSync(path));
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
export function fileDigest(path: string, cacheDir: string | null): string {
  const cache = new DigestCache(cacheDir, path);
  const digest = cache.digest(path, statSync(path));
  cache.save();
  return digest;
}

/** Version-control metadata and what builds and imports write into a project: never read by a fresh install. */
const NEVER_READ_DIRS = new Set([".git", ".hg", ".svn", ".bzr", "__pycache__"]);
/** setuptools' in-tree build folder (build/lib, build/temp.linux-x86_64-cpython-311, ...): its output, not its input. */
const SETUPTOOLS_BUILD_ENTRY = /^(lib|temp|bdist|scripts)([.-].+)?$/;

export interface TreeOptions {
  /** An editable install serves pure-Python sources inside its packages live: an edit there needs no rebuild. */
  editable: boolean;
  cacheDir: string | null;
}

export interface TreeDigest {
  digest: string;
  files: number;
}

/**
 * A project folder by everything a fresh install reads: every file, symlinks
 * followed, except VCS metadata, what the project's .gitignore files exclude,
 * bytecode, egg-info and setuptools' own build output.
 */
export function treeDigest(root: string, opts: TreeOptions): TreeDigest {
  const cache = new DigestCache(opts.cacheDir, `tree:${root}`);
  // Hashed once at the end: one update per file costs more than the stat.
  const parts: string[] = [];
  const seenDirs = new Set<string>();
  let files = 0;
  const walk = (dir: string, rel: string, rules: { base: string; ig: Ignore }[]) => {
    let real: string;
    try {
      real = realpathSync(dir);
    } catch {
      return;
    }
    if (seenDirs.has(real)) return; // a symlink loop
    seenDirs.add(real);
    const names = readdirSync(dir).sort();
    if (names.includes(".gitignore")) {
      try {
        rules = [...rules, { base: dir, ig: ignore().add(readFileSync(join(dir, ".gitignore"), "utf8")) }];
      } catch {
        // an unreadable ignore file excludes nothing
      }
    }
    const isPackage = opts.editable && dir !== root && names.includes("__init__.py");
    for (const name of names) {
      const path = `${dir}/${name}`; // not join(): it normalises, and this runs per file
      const relPath = rel ? `${rel}/${name}` : name;
      // Follows symlinks: their target's content is what gets installed.
      const stat = statSync(path, { throwIfNoEntry: false });
      if (!stat) {
        parts.push("dangling", relPath);
        continue;
      }
      const isDir = stat.isDirectory();
      if (isDir && (NEVER_READ_DIRS.has(name) || name.endsWith(".egg-info"))) continue;
      if (!isDir && (name.endsWith(".pyc") || name.endsWith(".pyo"))) continue;
      if (isDir && dir === root && name === "build" && readdirSync(path).every((e) => SETUPTOOLS_BUILD_ENTRY.test(e))) continue;
      if (rules.length && rules.some(({ base, ig }) => ig.ignores(relative(base, path) + (isDir ? "/" : "")))) continue;
      if (isDir) {
        walk(path, relPath, rules);
        continue;
      }
      if (!stat.isFile()) continue; // sockets, FIFOs: nothing an installer copies
      if (isPackage && name.endsWith(".py")) {
        parts.push("live", relPath); // served by the live link: its name counts, not its content
        continue;
      }
      parts.push("file", relPath, cache.digest(path, stat, relPath));
      files++;
    }
  };
  walk(root, "", []);
  cache.save();
  return { digest: contentHash(parts.join("\0")), files };
}

/** A find-links location on disk: a folder by its files, a file by its bytes, "missing" when absent (pip warns and goes on). */
export function findLinksDigest(path: string, cacheDir: string | null): string {
  const stat = statSync(path, { throwIfNoEntry: false });
  if (!stat) return "missing";
  return stat.isDirectory() ? folderDigest(path, cacheDir) : fileDigest(path, cacheDir);
}

/** A local find-links folder: the names and content of what pip would pick from (its files; pip does not descend). */
export function folderDigest(dir: string, cacheDir: string | null): string {
  const cache = new DigestCache(cacheDir, `folder:${dir}`);
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
