import { readdirSync, readFileSync, type Stats } from "node:fs";
import { join, relative } from "node:path";
import type { Ignore } from "ignore";
import { contentHash } from "../../core/hashing.ts";
import { UsageError } from "../../errors.ts";
import { DigestCache, type OnHashing, RACY_MS } from "./content-digest.ts";
import { buildReads } from "./build-config.ts";
import { keepAnswer, keptAnswer, newestChange, type Seen, statFollowing, type WalkAnswer } from "./tree-state.ts";

/**
 * A project folder by everything a fresh install reads: every file, symlinks
 * followed, except VCS metadata, caches, bytecode and setuptools' own build
 * output. Outside package folders, what the project's .gitignore files exclude
 * is left out too (build outputs, node_modules, data sets); inside a package
 * folder every file counts whatever .gitignore says, as backends install
 * package data and prebuilt libraries from there. A setup.py that computes a
 * path may read any file: then the whole project counts (build-config.ts), virtual environments aside.
 *
 * The warm path is a stat per file and per folder, and nothing else: a walk
 * records every path whose state it went by (each folder it listed, each file
 * it counted or read, each name it found missing), with that state, and the
 * next run stats the same paths in the same order. When each is what it was,
 * and all had settled (older than RACY_MS), the tree is the one digested:
 * a folder's listing cannot change without its mtime moving (POSIX: creating,
 * removing or renaming an entry updates the parent folder), which is what
 * git's untracked cache rests on, and a file's content not without its
 * ctime moving. Only a change walks the tree again and reads the per-file cache.
 */

export interface TreeOptions {
  /** An editable install serves pure-Python sources inside its packages live: an edit there needs no rebuild. */
  editable: boolean;
  cacheDir: string | null;
  /** The clock that says whether a file is settled (RACY_MS); injected by tests. */
  now?: () => number;
  onHashing?: OnHashing;
}

export type TreeDigest = WalkAnswer;

export function treeDigest(root: string, opts: TreeOptions): TreeDigest {
  const now = opts.now ?? Date.now;
  const kept = opts.cacheDir ? keptAnswer(opts.cacheDir, root, opts.editable) : null;
  if (kept) return kept;

  const cache = new DigestCache(opts.cacheDir, `tree:${root}`, now, opts.onHashing);
  let walked: Walked;
  const parts: string[] = [];
  let files = 0;
  try {
    walked = walkTree(root, opts.editable);
  } catch (error) {
    throw unreadable(root, error);
  }
  // Hashed once at the end: one update per file costs more than the stat.
  for (const item of walked.items) {
    if (item.kind !== "file") parts.push(item.kind, item.relPath);
    else {
      try {
        parts.push("file", item.relPath, cache.digest(item.path, item.stat!, item.relPath));
      } catch (error) {
        throw unreadable(root, error, item.path);
      }
      files++;
    }
  }
  cache.save();
  const result = { digest: contentHash(parts.join("\0")), files };
  // States taken before their content was read: a change after that shows next time. Kept only once all have settled.
  if (opts.cacheDir && walked.keepable && now() - newestChange(walked.seen) > RACY_MS) keepAnswer(opts.cacheDir, root, opts.editable, walked.seen, result);
  return result;
}

/**
 * The files a fresh (not editable) install of the project at `root` reads, relative to it: what the key counts, by
 * the same walk. A job's bundle carries them whatever .gitignore says, so a worker builds what this machine builds.
 */
export function installedFiles(root: string): string[] {
  try {
    return walkTree(root, false).items.filter((i) => i.kind === "file").map((i) => i.relPath);
  } catch (error) {
    throw unreadable(root, error);
  }
}

/** A file or folder of the project that cannot be read (no permission, a /proc file): one line naming it, not an internal error. */
function unreadable(root: string, error: unknown, path?: string): unknown {
  const e = error as NodeJS.ErrnoException;
  if (typeof e?.code !== "string") return error;
  return new UsageError(`local project ${root}: cannot read ${e.path ?? path ?? "a file in it"} (${e.code})`);
}

interface TreeItem {
  /** file: by content; live: served by an editable's live link, by name; dangling: a symlink to nothing. */
  kind: "file" | "live" | "dangling";
  relPath: string;
  path: string;
  stat: Stats | null;
}

interface Walked {
  items: TreeItem[];
  seen: Seen[];
  /** False when the walk went by something it cannot state again (an unreadable path): no summary is kept. */
  keepable: boolean;
}

/** Version-control metadata and what tools and imports write into a project: never read by a fresh install. */
const NEVER_READ_DIRS = new Set([".git", ".hg", ".svn", ".bzr", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", ".ipynb_checkpoints"]);
/** setuptools' in-tree build folder (build/lib, build/temp.linux-x86_64-cpython-311, ...): its output, not its input. */
const SETUPTOOLS_BUILD_ENTRY = /^(lib|temp|bdist|scripts)([.-].+)?$/;

/** What compilers and linkers write: an ignored one in an editable project's package is an in-place build's output, served by the live link. */
const NATIVE_OUTPUT = /\.(so|pyd|dylib|dll|o|obj|a|lib)$|\.so\.\d/i;

/** Modules a build reads for metadata, whatever the backend: versions and abouts, and each package's __init__.py (flit's docstring and __version__). */
const METADATA_MODULE = /^(__init__|_*version_*|_*about_*)\.py$/i;

/** What a fresh install of the project reads, in a stable order (the files, and the names that count by name only), and what the walk went by. */
function walkTree(root: string, editable: boolean): Walked {
  const items: TreeItem[] = [];
  const seen: Seen[] = [];
  let keepable = true;
  /** A path's state, taken before what it holds is read, and kept for the next run's check. */
  const see = (relPath: string): Stats | null => {
    let stat: Stats | null;
    try {
      stat = statFollowing(relPath ? `${root}/${relPath}` : root);
    } catch {
      keepable = false;
      stat = null;
    }
    seen.push({ relPath, stat });
    return stat;
  };
  const seenDirs = new Set<string>();
  const reads = buildReads(root, see);
  // inPackage: inside a Python package folder, where backends install what is there whatever .gitignore says (package
  // data, a prebuilt library, a generated module): there, and everywhere when setup.py may read any file, ignore rules
  // leave out nothing but an editable's in-place build output.
  const walk = (dir: string, rel: string, rules: { base: string; ig: Ignore }[], inPackage: boolean) => {
    // Its listing's state (an entry added, removed or renamed moves its mtime), taken before it is read; for a link
    // that closes a loop too: pointed elsewhere, it holds something. A folder is known by its device and inode (the
    // state kept), not its path: a bind mount's second path to it is the same folder.
    const state = see(rel);
    if (!state) return;
    const folder = `${state.dev}:${state.ino}`;
    if (seenDirs.has(folder)) return; // a symlink loop, or a folder reached again
    seenDirs.add(folder);
    // An editable project's listing comes with entry types (d_type): there a folder, or a module the live link serves,
    // needs no stat of its own. Elsewhere every file is stat'ed for its identity anyway, and types would cost more than
    // they save. Names sorted by the engine's own sort (a comparator is called ~20,000 times for 2,000 names).
    const typed = editable ? new Map(readdirSync(dir, { withFileTypes: true }).map((e) => [e.name, e])) : null;
    const names = typed ? [...typed.keys()].sort() : readdirSync(dir).sort();
    if (names.includes(".gitignore")) {
      const ignoreFile = rel ? `${rel}/.gitignore` : ".gitignore";
      // Read only as a regular file: a FIFO would block the read (git's own rules aside, pip reads none of it).
      if (see(ignoreFile)?.isFile()) {
        try {
          rules = [...rules, { base: dir, ig: newIgnore().add(readFileSync(join(dir, ".gitignore"), "utf8")) }];
        } catch {
          // an unreadable ignore file excludes nothing
        }
      }
    }
    const packageDir = inPackage || (dir !== root && names.includes("__init__.py"));
    const isPackage = editable && !reads.wholeProject && dir !== root && names.includes("__init__.py");
    const allCount = packageDir || reads.wholeProject;
    for (const name of names) {
      const entry = typed?.get(name);
      const path = `${dir}/${name}`; // not join(): it normalises, and this runs per file
      const relPath = rel ? `${rel}/${name}` : name;
      // Follows symlinks: their target's content is what gets installed. Stat'ed now: an untyped listing's entry, a
      // link, and one whose type the listing did not say (DT_UNKNOWN on some filesystems; a FIFO).
      let stat: Stats | null | undefined;
      if (!entry || entry.isSymbolicLink() || !(entry.isFile() || entry.isDirectory())) {
        stat = statFollowing(path);
        // Kept whatever follows: what it is decides whether it is skipped, ignored, walked or counted, and a link's
        // target may change kind (a folder made a file, a FIFO a file, a module gone) with no folder here moving.
        seen.push({ relPath, stat });
        if (!stat) {
          items.push({ kind: "dangling", relPath, path, stat: null });
          continue;
        }
      }
      const isDir = stat ? stat.isDirectory() : entry!.isDirectory();
      if (isDir && NEVER_READ_DIRS.has(name)) continue;
      // A build's own egg-info sits beside the packages; one inside a package is package data.
      if (isDir && !packageDir && name.endsWith(".egg-info")) continue;
      if (!isDir && (name.endsWith(".pyc") || name.endsWith(".pyo"))) continue;
      if (isDir && dir === root && name === "build" && see(relPath) && readdirSync(path).every((e) => SETUPTOOLS_BUILD_ENTRY.test(e))) continue;
      // Ignore rules decide outside packages; in them (and everywhere, when setup.py may read any file) only about an
      // editable's native libraries, an in-place build's output the live link serves; and a virtual environment.
      const inPlaceOutput = editable && !isDir && NATIVE_OUTPUT.test(name);
      const venvCandidate = reads.wholeProject && !packageDir && isDir;
      if (rules.length && (!allCount || inPlaceOutput || venvCandidate) && ignoredBy(rules, path, isDir)) {
        if (!allCount || inPlaceOutput || see(`${relPath}/pyvenv.cfg`)) continue;
      }
      if (isDir) {
        walk(path, relPath, rules, packageDir);
        continue;
      }
      if (!(stat ? stat.isFile() : entry!.isFile())) continue; // sockets, FIFOs: nothing an installer copies
      // Served by the live link: its name counts, not its content; unless a build reads it (metadata, a version).
      const live = isPackage && name.endsWith(".py") && !METADATA_MODULE.test(name) && !reads.modules.has(relPath);
      if (live) {
        items.push({ kind: "live", relPath, path, stat: null });
        continue;
      }
      if (stat === undefined) {
        stat = statFollowing(path);
        seen.push({ relPath, stat });
      }
      // Gone since the listing: as a dangling link, by name (the next prepare sees the tree as it is then).
      items.push(stat ? { kind: "file", relPath, path, stat } : { kind: "dangling", relPath, path, stat: null });
    }
  };
  walk(root, "", [], false);
  return { items, seen, keepable };
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
