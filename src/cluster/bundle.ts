import bytes from "bytes";
import ignore, { type Ignore } from "ignore";
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync } from "node:fs";
import { dirname, isAbsolute, join, posix, relative, resolve } from "node:path";
import * as tar from "tar";
import { BundleError, ExitCode } from "../errors.ts";
import type { BundleLimits } from "./bundle-limits.ts";
import { inflating, inspectBundle } from "./bundle-check.ts";
export { type BundleLimits, bundleLimits } from "./bundle-limits.ts";
export { inspectBundle } from "./bundle-check.ts";

/**
 * Bundles: a job's workdir as a tar.gz, packed the same way every time (sorted
 * entries, no owners, no times), so its sha256 names its content and an
 * unchanged folder is never sent twice. Unpacking checks every entry before
 * anything is written.
 */

/** What is never worth sending, as .gitignore patterns (at any depth). */
export const DEFAULT_EXCLUDES = [".git/", ".hg/", ".svn/", ".venv/", "venv/", "__pycache__/", "*.pyc", ".mypy_cache/", ".pytest_cache/", ".ruff_cache/", ".tox/", "node_modules/", ".ipynb_checkpoints/", ".DS_Store"];
const IGNORE_FILES = [".gitignore", ".gpulayerignore"];



interface Rule {
  base: string;
  ig: Ignore;
  /** A .gpulayerignore: its `!pattern` can send a file only its owner may read. */
  explicit: boolean;
}

function rulesIn(absDir: string, base: string): Rule[] {
  const rules: Rule[] = [];
  for (const name of IGNORE_FILES) {
    const file = join(absDir, name);
    if (existsSync(file)) rules.push({ base, ig: ignore().add(readFileSync(file, "utf8")), explicit: name === ".gpulayerignore" });
  }
  return rules;
}

/** Deeper files win, and a `!pattern` re-includes, as in git. "included": the last word was a .gpulayerignore `!pattern`. */
function verdict(rules: Rule[], rel: string, isDir: boolean): "ignored" | "included" | "sent" {
  let out: "ignored" | "included" | "sent" = "sent";
  for (const r of rules) {
    const sub = r.base ? rel.slice(r.base.length + 1) : rel;
    const res = r.ig.test(isDir ? `${sub}/` : sub);
    if (res.ignored) out = "ignored";
    else if (res.unignored) out = r.explicit ? "included" : "sent";
  }
  return out;
}

function ignored(rules: Rule[], rel: string, isDir: boolean): boolean {
  return verdict(rules, rel, isDir) === "ignored";
}

/**
 * What a fresh install of the request's local projects reads (env/tree-digest.ts installedFiles), by path relative to
 * the bundle's root: sent whatever .gitignore and the default excludes say, as the key counts it, so a worker builds
 * what this machine builds. A .gpulayerignore still leaves one out: the bundle is the user's to trim.
 */
export class Carried {
  private readonly dirs = new Set<string>();
  constructor(readonly files: ReadonlySet<string>) {
    for (const f of files) for (let i = f.indexOf("/"); i > 0; i = f.indexOf("/", i + 1)) this.dirs.add(f.slice(0, i));
  }
  /** A file, or a folder (or a link standing for one) that holds one. */
  has(rel: string): boolean {
    return this.files.has(rel) || this.dirs.has(rel);
  }
  static readonly none = new Carried(new Set());
}

/** Left out: by the rules, unless carried and not by a .gpulayerignore. */
function leftOut(rules: Rule[], rel: string, isDir: boolean, carried: Carried): boolean {
  if (!ignored(rules, rel, isDir)) return false;
  return !carried.has(rel) || ignored(rules.filter((r) => r.explicit), rel, isDir);
}

/**
 * What marks a gpulayer home (its token, identity, environments and job databases): never packed. A server started
 * with --token keeps no token file but its database; a worker that never registered has its outbox.
 */
const HOME_MARKS: string[][] = [["envs-v1", "jobs"], ["server/token"], ["server/server.db"], ["cluster/identity"], ["cluster/outbox.db"]];

/** The mark of a gpulayer home in `absDir` that the rules would send, or null. */
function homeMark(absDir: string, relDir: string, rules: Rule[], carried: Carried): string | null {
  for (const mark of HOME_MARKS) {
    const present = mark.every((m) => existsSync(join(absDir, m)) && !leftOut(rules, relDir ? `${relDir}/${m}` : m, statSync(join(absDir, m)).isDirectory(), carried));
    if (present) return mark.join(" and ");
  }
  return null;
}

/** How packing is going, every PROGRESS_EVERY entries. */
export interface PackProgress {
  entries: number;
  bytes: number;
}
export const PROGRESS_EVERY = 1000;

export interface FileList {
  /** Paths relative to the root, sorted, folders before what they hold. */
  entries: string[];
  rawBytes: number;
  skipped: { path: string; reason: string }[];
  /** Files only their owner may read (mode & 0o044 === 0), left out unless a .gpulayerignore `!pattern` names them. */
  ownerOnly: string[];
  /** Top-level entries by size, biggest first (for the size-limit message). */
  sizes: { path: string; bytes: number }[];
}

/** What a bundle of `root` holds: .gitignore, .gpulayerignore and the default excludes honoured (but for what `carried` names); links kept only when they stay inside. */
export function listWorkdir(root: string, onProgress?: (p: PackProgress) => void, carried: Carried = Carried.none): FileList {
  const list: FileList = { entries: [], rawBytes: 0, skipped: [], ownerOnly: [], sizes: [] };
  const top = new Map<string, number>();
  let seen = 0;
  const walk = (absDir: string, relDir: string, rules: Rule[]) => {
    const here = [...rules, ...rulesIn(absDir, relDir)];
    const mark = homeMark(absDir, relDir, here, carried);
    if (mark) throw new BundleError(`the workdir ${root} holds a gpulayer home at ${relDir || "."} (it has ${mark}): its token, identity and databases must not travel; leave it out with .gpulayerignore or give another --workdir`, ExitCode.usage);
    const names = readdirSync(absDir).sort();
    for (const name of names) {
      const rel = relDir ? `${relDir}/${name}` : name;
      const abs = join(absDir, name);
      const st = lstatSync(abs);
      const topName = rel.split("/")[0]!;
      if (onProgress && ++seen % PROGRESS_EVERY === 0) onProgress({ entries: seen, bytes: list.rawBytes });
      if (st.isSymbolicLink()) {
        if (leftOut(here, rel, false, carried)) continue;
        const target = readlinkSync(abs);
        const inside = relative(root, resolve(absDir, target));
        if (isAbsolute(target) || inside.startsWith("..") || isAbsolute(inside)) list.skipped.push({ path: rel, reason: `link to ${target} points outside the workdir` });
        else list.entries.push(rel);
      } else if (st.isDirectory()) {
        if (leftOut(here, rel, true, carried)) continue;
        list.entries.push(rel);
        walk(abs, rel, here);
      } else if (st.isFile()) {
        const v = verdict(here, rel, false);
        if (v === "ignored" && leftOut(here, rel, false, carried)) continue;
        if ((st.mode & 0o044) === 0 && v !== "included") {
          list.ownerOnly.push(rel);
          continue;
        }
        list.entries.push(rel);
        list.rawBytes += st.size;
        top.set(topName, (top.get(topName) ?? 0) + st.size);
      } else list.skipped.push({ path: rel, reason: "not a file, folder or link" });
    }
  };
  walk(root, "", [{ base: "", ig: ignore().add(DEFAULT_EXCLUDES), explicit: false }]);
  list.sizes = [...top.entries()].map(([path, n]) => ({ path, bytes: n })).sort((a, b) => b.bytes - a.bytes);
  return list;
}

export interface PackResult {
  file: string;
  hash: string;
  bytes: number;
  files: number;
  entries: string[];
  rawBytes: number;
  skipped: FileList["skipped"];
  ownerOnly: string[];
}

/**
 * `paths` (relative to `root`) packed into `outFile` as every bundle is (tar.gz, sorted, no owners, no times: its
 * sha256 names its content), under the limits; `what` names it (unpacked, and packed) and `hint` says how to make
 * it smaller, the one thing that differs between a workdir and a task's outputs.
 */
function packPaths(root: string, paths: string[], rawBytes: number, sizes: FileList["sizes"], outFile: string, limits: BundleLimits, what: { raw: string; packed: string }, hint: string): { hash: string; bytes: number } {
  if (rawBytes > limits.maxUnpackedBytes) throw tooBig(what.raw, rawBytes, limits.maxUnpackedBytes, "GPULAYER_BUNDLE_MAX_UNPACKED", sizes, hint);
  if (paths.length > limits.maxEntries) throw new BundleError(`${what.raw}: ${paths.length} entries, over the limit of ${limits.maxEntries}; ${hint}`);
  mkdirSync(dirname(outFile), { recursive: true });
  tar.c({ gzip: { level: 6 }, cwd: root, portable: true, mtime: new Date(0), sync: true, file: outFile, noDirRecurse: true, follow: false }, paths);
  const data = readFileSync(outFile);
  if (data.length > limits.maxBytes) {
    rmSync(outFile, { force: true });
    throw tooBig(what.packed, data.length, limits.maxBytes, "GPULAYER_BUNDLE_MAX", sizes, hint);
  }
  return { hash: new Bun.CryptoHasher("sha256").update(data).digest("hex"), bytes: data.length };
}

function tooBig(what: string, size: number, limit: number, setting: string, sizes: FileList["sizes"], hint: string): BundleError {
  const biggest = sizes
    .slice(0, 3)
    .map((s) => `${s.path} ${bytes.format(s.bytes)}`)
    .join(", ");
  return new BundleError(`${what} is ${bytes.format(size)}, over the limit of ${bytes.format(limit)} (${setting})${biggest ? `; biggest: ${biggest}` : ""}; ${hint}`);
}

/** Pack `root` into `outFile` (tar.gz); its sha256 is the bundle's name. */
export function packWorkdir(root: string, outFile: string, limits: BundleLimits, onProgress?: (p: PackProgress) => void, carried?: Carried): PackResult {
  const list = listWorkdir(root, onProgress, carried);
  // An empty folder still makes a valid archive: its root entry alone.
  const paths = list.entries.length ? list.entries : ["."];
  const packed = packPaths(root, paths, list.rawBytes, list.sizes, outFile, limits, { raw: `the workdir ${root}`, packed: `the packed workdir ${root}` }, "leave out what the job does not need with .gpulayerignore");
  return { file: outFile, ...packed, files: list.entries.length, entries: list.entries, rawBytes: list.rawBytes, skipped: list.skipped, ownerOnly: list.ownerOnly };
}

export function isBundleHash(s: string): boolean {
  return /^[0-9a-f]{64}$/.test(s);
}

/** Check, then unpack into `dest` (created; must not exist yet). Asynchronous: a worker keeps heartbeating meanwhile. */
export async function unpackBundle(file: string, dest: string, limits: BundleLimits): Promise<void> {
  await inspectBundle(file, limits);
  if (existsSync(dest)) throw new BundleError(`cannot unpack into ${dest}: it exists already`);
  mkdirSync(dest, { recursive: true });
  try {
    // Inflated by our stream (64 KiB pieces, back-pressured), not tar's own reader, which inflates 16 MiB reads at once.
    const { gunzip } = inflating(file);
    // Permission bits only: a setuid or setgid file (a root-owned copy, on a worker running as root) must not come of a bundle.
    const unpack = new tar.Unpack({ cwd: dest, strict: true, preserveOwner: false, noMtime: true, filter: (_path, entry) => ((entry.mode = (entry.mode ?? 0o644) & 0o777), true) });
    await new Promise<void>((done, fail) => {
      unpack.on("error", fail);
      gunzip.on("error", fail);
      unpack.on("close", done);
      gunzip.pipe(unpack);
    });
  } catch (error) {
    rmSync(dest, { recursive: true, force: true });
    throw new BundleError(`unpacking the bundle failed: ${(error as Error).message}`);
  }
}

/**
 * A task's outputs as an archive, packed as bundles are and under the same
 * limits: only the files named, each at its path relative to `root`.
 * `.gpulayerignore` does nothing here: what is too big is narrowed in the
 * task's `outputs:`.
 */
export function packFiles(root: string, files: { path: string; bytes: number }[], outFile: string, limits: BundleLimits, what: string): PackResult {
  const rawBytes = files.reduce((n, f) => n + f.bytes, 0);
  const sizes = files.map((f) => ({ path: f.path, bytes: f.bytes })).sort((a, b) => b.bytes - a.bytes);
  const paths = files.map((f) => f.path).sort();
  const packed = packPaths(root, paths, rawBytes, sizes, outFile, limits, { raw: what, packed: `${what}, packed,` }, "name fewer or smaller files in the task's outputs:");
  return { file: outFile, ...packed, files: paths.length, entries: paths, rawBytes, skipped: [], ownerOnly: [] };
}

/** The plain files an archive holds, with their sizes (read after its entry checks passed). */
export async function bundleFiles(file: string): Promise<{ path: string; bytes: number }[]> {
  const files: { path: string; bytes: number }[] = [];
  await tar.t({ file, onReadEntry: (e) => void (e.type === "File" && files.push({ path: posix.normalize(e.path), bytes: e.size ?? 0 })) });
  return files.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}
