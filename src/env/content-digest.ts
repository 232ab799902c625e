import { existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, type Stats, statSync } from "node:fs";
import { join, relative } from "node:path";
import type { Ignore } from "ignore";
import { writeFileAtomic } from "../core/atomic.ts";
import { contentHash, fileContentHash } from "../core/hashing.ts";

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

/** Version-control metadata and what builds and imports write into a project: never read by a fresh install. */
const NEVER_READ_DIRS = new Set([".git", ".hg", ".svn", ".bzr", "__pycache__"]);
/** setuptools' in-tree build folder (build/lib, build/temp.linux-x86_64-cpython-311, ...): its output, not its input. */
const SETUPTOOLS_BUILD_ENTRY = /^(lib|temp|bdist|scripts)([.-].+)?$/;

export interface TreeOptions {
  /** An editable install serves pure-Python sources inside its packages live: an edit there needs no rebuild. */
  editable: boolean;
  cacheDir: string | null;
  /** The clock that says whether a file is settled (RACY_MS); injected by tests. */
  now?: () => number;
  onHashing?: OnHashing;
}

export interface TreeDigest {
  digest: string;
  files: number;
}

/**
 * A project folder by everything a fresh install reads: every file, symlinks
 * followed, except VCS metadata, what the project's .gitignore files exclude,
 * bytecode, egg-info and setuptools' own build output.
 *
 * The warm path is a stat per file: when every file's identity (path, size,
 * mtime, ctime, inode, device) is what it was when the tree was last digested,
 * and all were settled then (older than RACY_MS), that digest is the answer,
 * kept in a small file of its own; only a change reads the per-file cache.
 */
export function treeDigest(root: string, opts: TreeOptions): TreeDigest {
  const now = opts.now ?? Date.now;
  const cache = new DigestCache(opts.cacheDir, `tree:${root}`, now, opts.onHashing);
  const items = walkTree(root, opts.editable);
  // The stat fields as raw doubles: formatting 10,000 floats as text would cost more than the stats.
  // One plain loop for names and numbers: half the time of a forEach and a map-join over 2,000 files.
  let newest = 0;
  let names = "";
  const numbers = new Float64Array(items.length * 5);
  for (let i = 0; i < items.length; i++) {
    const item = items[i]!;
    names += `${item.kind}\0${item.relPath}\0`;
    const st = item.stat;
    if (!st) continue;
    newest = Math.max(newest, st.mtimeMs, st.ctimeMs);
    const at = i * 5;
    numbers[at] = st.size;
    numbers[at + 1] = st.mtimeMs;
    numbers[at + 2] = st.ctimeMs;
    numbers[at + 3] = st.ino;
    numbers[at + 4] = st.dev;
  }
  const hasher = new Bun.CryptoHasher("sha256");
  hasher.update(names);
  hasher.update(numbers);
  const identity = hasher.digest("hex");
  const summaryFile = opts.cacheDir ? join(opts.cacheDir, `${contentHash(`tree-summary:${opts.editable}:${root}`).slice(0, 32)}.json`) : null;
  if (summaryFile) {
    try {
      const kept = JSON.parse(readFileSync(summaryFile, "utf8")) as { identity: string } & TreeDigest;
      if (kept.identity === identity) return { digest: kept.digest, files: kept.files };
    } catch {
      // none yet: digested below
    }
  }
  // Hashed once at the end: one update per file costs more than the stat.
  const parts: string[] = [];
  let files = 0;
  for (const item of items) {
    if (item.kind !== "file") parts.push(item.kind, item.relPath);
    else {
      parts.push("file", item.relPath, cache.digest(item.path, item.stat!, item.relPath));
      files++;
    }
  }
  cache.save();
  const result = { digest: contentHash(parts.join("\0")), files };
  if (summaryFile && now() - newest > RACY_MS) {
    try {
      mkdirSync(opts.cacheDir!, { recursive: true });
      writeFileAtomic(summaryFile, JSON.stringify({ identity, ...result }));
    } catch {
      // not kept: the next run reads the per-file cache
    }
  }
  return result;
}

/** stat(2), or null for a dangling link; without an options object, which costs Bun's statSync a tenth more per file. */
function statFollowing(path: string): Stats | null {
  try {
    return statSync(path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw error;
  }
}

interface TreeItem {
  /** file: by content; live: served by an editable's live link, by name; dangling: a symlink to nothing. */
  kind: "file" | "live" | "dangling";
  relPath: string;
  path: string;
  stat: Stats | null;
}

/** What compilers and linkers write: in a package folder, an ignored one is a build's output, not its input. */
const NATIVE_OUTPUT = /\.(so|pyd|dylib|dll|o|obj|a|lib)$|\.so\.\d/i;

/** Modules a build reads for metadata, whatever the backend: versions and abouts, and each package's __init__.py (flit's docstring and __version__). */
const METADATA_MODULE = /^(__init__|_*version_*|_*about_*)\.py$/i;

/**
 * The modules an editable project's build configuration names (setuptools'
 * `attr:`, hatch's version `path`, any `*.py` a setup.py opens), by path
 * relative to the project: a build reads them, so they count by content
 * even where the live link serves them. Read conservatively: a name too many
 * costs a rebuild, a name missed a stale env.
 */
function modulesBuildReads(root: string): Set<string> {
  const named = new Set<string>();
  for (const file of ["pyproject.toml", "setup.cfg", "setup.py"]) {
    let text: string;
    try {
      text = readFileSync(join(root, file), "utf8");
    } catch {
      continue;
    }
    for (const m of text.matchAll(/\battr\s*[:=]\s*["']?([A-Za-z_][\w.]*)/g)) {
      const module = m[1]!.split(".").slice(0, -1).join("/");
      if (!module) continue;
      for (const base of ["", "src/"]) named.add(`${base}${module}.py`).add(`${base}${module}/__init__.py`);
    }
    for (const m of text.matchAll(/["']([^"'\s]+\.py)["']/g)) named.add(m[1]!.replace(/^\.\//, ""));
  }
  return named;
}

/** What a fresh install of the project reads, in a stable order: the files, and the names that count by name only. */
function walkTree(root: string, editable: boolean): TreeItem[] {
  const items: TreeItem[] = [];
  const seenDirs = new Set<string>();
  const buildReads = editable ? modulesBuildReads(root) : new Set<string>();
  // inPackage: inside a Python package folder, where setuptools installs what is there whatever .gitignore says
  // (a generated module, data a test tracks): there ignore rules leave out only what it would not install.
  const walk = (dir: string, rel: string, rules: { base: string; ig: Ignore }[], inPackage: boolean) => {
    let real: string;
    try {
      real = realpathSync(dir);
    } catch {
      return;
    }
    if (seenDirs.has(real)) return; // a symlink loop
    seenDirs.add(real);
    // An editable project's listing comes with entry types (d_type): there a folder, or a module the live link serves,
    // needs no stat of its own. Elsewhere every file is stat'ed for its identity anyway, and types would cost more than
    // they save. Names sorted by the engine's own sort (a comparator is called ~20,000 times for 2,000 names).
    const typed = editable ? new Map(readdirSync(dir, { withFileTypes: true }).map((e) => [e.name, e])) : null;
    const names = typed ? [...typed.keys()].sort() : readdirSync(dir).sort();
    if (names.includes(".gitignore")) {
      try {
        rules = [...rules, { base: dir, ig: newIgnore().add(readFileSync(join(dir, ".gitignore"), "utf8")) }];
      } catch {
        // an unreadable ignore file excludes nothing
      }
    }
    const packageDir = inPackage || (dir !== root && names.includes("__init__.py"));
    const isPackage = editable && dir !== root && names.includes("__init__.py");
    for (const name of names) {
      const entry = typed?.get(name);
      const path = `${dir}/${name}`; // not join(): it normalises, and this runs per file
      const relPath = rel ? `${rel}/${name}` : name;
      // Follows symlinks: their target's content is what gets installed. Stat'ed now: an untyped listing's entry, a
      // link, and one whose type the listing did not say (DT_UNKNOWN on some filesystems; a FIFO).
      let stat: Stats | null | undefined;
      if (!entry || entry.isSymbolicLink() || !(entry.isFile() || entry.isDirectory())) {
        stat = statFollowing(path);
        if (!stat) {
          items.push({ kind: "dangling", relPath, path, stat: null });
          continue;
        }
      }
      const isDir = stat ? stat.isDirectory() : entry!.isDirectory();
      if (isDir && (NEVER_READ_DIRS.has(name) || name.endsWith(".egg-info"))) continue;
      if (!isDir && (name.endsWith(".pyc") || name.endsWith(".pyo"))) continue;
      if (isDir && dir === root && name === "build" && readdirSync(path).every((e) => SETUPTOOLS_BUILD_ENTRY.test(e))) continue;
      // In a package, ignore rules still leave out what setuptools would not install there: an ignored folder that is no
      // package itself (node_modules, a tool's cache), and an ignored native library, an in-place build's output.
      const installedAnyway = packageDir && (isDir ? existsSync(`${path}/__init__.py`) : !NATIVE_OUTPUT.test(name));
      if (rules.length && !installedAnyway && ignoredBy(rules, path, isDir)) continue;
      if (isDir) {
        walk(path, relPath, rules, packageDir);
        continue;
      }
      if (!(stat ? stat.isFile() : entry!.isFile())) continue; // sockets, FIFOs: nothing an installer copies
      // Served by the live link: its name counts, not its content; unless a build reads it (metadata, a version).
      const live = isPackage && name.endsWith(".py") && !METADATA_MODULE.test(name) && !buildReads.has(relPath);
      if (live) {
        items.push({ kind: "live", relPath, path, stat: null });
        continue;
      }
      stat ??= statFollowing(path);
      // Gone since the listing: as a dangling link, by name (the next prepare sees the tree as it is then).
      items.push(stat ? { kind: "file", relPath, path, stat } : { kind: "dangling", relPath, path, stat: null });
    }
  };
  walk(root, "", [], false);
  return items;
}

/** Loaded at the first .gitignore: a warm prepare without local projects never evaluates it. */
function newIgnore(): Ignore {
  return (require("ignore") as typeof import("ignore"))();
}

/** git's reading of nested .gitignore files: the deepest file with a rule for the path decides (a `!pattern` there re-includes it). */
function ignoredBy(rules: { base: string; ig: Ignore }[], path: string, isDir: boolean): boolean {
  for (let i = rules.length - 1; i >= 0; i--) {
    const { base, ig } = rules[i]!;
    const verdict = ig.test(relative(base, path) + (isDir ? "/" : ""));
    if (verdict.ignored) return true;
    if (verdict.unignored) return false;
  }
  return false;
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
