import bytes from "bytes";
import ignore, { type Ignore } from "ignore";
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync } from "node:fs";
import { dirname, isAbsolute, join, posix, relative, resolve } from "node:path";
import * as tar from "tar";
import { BundleError, ExitCode } from "../errors.ts";
import type { BundleLimits } from "./bundle-limits.ts";
export { type BundleLimits, bundleLimits } from "./bundle-limits.ts";

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

/** What marks a gpulayer home (its token, identity, environments and job databases): never packed. */
const HOME_MARKS: string[][] = [["envs-v1", "jobs"], ["server/token"], ["cluster/identity"]];

/** The mark of a gpulayer home in `absDir` that the rules would send, or null. */
function homeMark(absDir: string, relDir: string, rules: Rule[]): string | null {
  for (const mark of HOME_MARKS) {
    const present = mark.every((m) => existsSync(join(absDir, m)) && !ignored(rules, relDir ? `${relDir}/${m}` : m, statSync(join(absDir, m)).isDirectory()));
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

/** What a bundle of `root` holds: .gitignore, .gpulayerignore and the default excludes honoured; links kept only when they stay inside. */
export function listWorkdir(root: string, onProgress?: (p: PackProgress) => void): FileList {
  const list: FileList = { entries: [], rawBytes: 0, skipped: [], ownerOnly: [], sizes: [] };
  const top = new Map<string, number>();
  let seen = 0;
  const walk = (absDir: string, relDir: string, rules: Rule[]) => {
    const here = [...rules, ...rulesIn(absDir, relDir)];
    const mark = homeMark(absDir, relDir, here);
    if (mark) throw new BundleError(`the workdir ${root} holds a gpulayer home at ${relDir || "."} (it has ${mark}): its token, identity and databases must not travel; leave it out with .gpulayerignore or give another --workdir`, ExitCode.usage);
    const names = readdirSync(absDir).sort();
    for (const name of names) {
      const rel = relDir ? `${relDir}/${name}` : name;
      const abs = join(absDir, name);
      const st = lstatSync(abs);
      const topName = rel.split("/")[0]!;
      if (onProgress && ++seen % PROGRESS_EVERY === 0) onProgress({ entries: seen, bytes: list.rawBytes });
      if (st.isSymbolicLink()) {
        if (ignored(here, rel, false)) continue;
        const target = readlinkSync(abs);
        const inside = relative(root, resolve(absDir, target));
        if (isAbsolute(target) || inside.startsWith("..") || isAbsolute(inside)) list.skipped.push({ path: rel, reason: `link to ${target} points outside the workdir` });
        else list.entries.push(rel);
      } else if (st.isDirectory()) {
        if (ignored(here, rel, true)) continue;
        list.entries.push(rel);
        walk(abs, rel, here);
      } else if (st.isFile()) {
        const v = verdict(here, rel, false);
        if (v === "ignored") continue;
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

function tooBig(what: string, size: number, limit: number, setting: string, sizes: FileList["sizes"]): BundleError {
  const biggest = sizes
    .slice(0, 3)
    .map((s) => `${s.path} ${bytes.format(s.bytes)}`)
    .join(", ");
  return new BundleError(`${what} is ${bytes.format(size)}, over the limit of ${bytes.format(limit)} (${setting})${biggest ? `; biggest: ${biggest}` : ""}; leave out what the job does not need with .gpulayerignore`);
}

/** Pack `root` into `outFile` (tar.gz); its sha256 is the bundle's name. */
export function packWorkdir(root: string, outFile: string, limits: BundleLimits, onProgress?: (p: PackProgress) => void): PackResult {
  const list = listWorkdir(root, onProgress);
  if (list.rawBytes > limits.maxUnpackedBytes) throw tooBig(`the workdir ${root}`, list.rawBytes, limits.maxUnpackedBytes, "GPULAYER_BUNDLE_MAX_UNPACKED", list.sizes);
  if (list.entries.length > limits.maxEntries) throw new BundleError(`the workdir ${root} has ${list.entries.length} entries, over the limit of ${limits.maxEntries}; leave some out with .gpulayerignore`);
  mkdirSync(dirname(outFile), { recursive: true });
  // An empty folder still makes a valid archive: its root entry alone.
  const paths = list.entries.length ? list.entries : ["."];
  tar.c({ gzip: { level: 6 }, cwd: root, portable: true, mtime: new Date(0), sync: true, file: outFile, noDirRecurse: true, follow: false }, paths);
  const data = readFileSync(outFile);
  if (data.length > limits.maxBytes) {
    rmSync(outFile, { force: true });
    throw tooBig(`the packed workdir ${root}`, data.length, limits.maxBytes, "GPULAYER_BUNDLE_MAX", list.sizes);
  }
  const hash = new Bun.CryptoHasher("sha256").update(data).digest("hex");
  return { file: outFile, hash, bytes: data.length, files: list.entries.length, entries: list.entries, rawBytes: list.rawBytes, skipped: list.skipped, ownerOnly: list.ownerOnly };
}

export function isBundleHash(s: string): boolean {
  return /^[0-9a-f]{64}$/.test(s);
}

const SAFE_TYPES = new Set(["File", "OldFile", "ContiguousFile", "Directory", "SymbolicLink", "Link"]);

/** Why a path inside a bundle is unsafe, or null. */
function unsafePath(p: string): string | null {
  if (p.includes("\0")) return "has a NUL byte";
  if (p.startsWith("/") || p.startsWith("\\") || /^[A-Za-z]:/.test(p)) return "is absolute";
  if (p.split(/[\\/]+/).includes("..")) return "climbs out with ..";
  return null;
}

/** What the checker knows of the tree a bundle builds, path (normalized, relative) → kind. */
type Node = { kind: "file" } | { kind: "dir" } | { kind: "link"; target: string };

/** As Linux (MAXSYMLINKS): a lookup that follows more links than this fails with ELOOP. */
const MAX_LINK_HOPS = 40;

/**
 * Where `target`, read from the folder `dir` (components from the root), leads
 * in `tree`: every link met on the way is followed, however it was reached.
 * Components the tree does not hold count as plain folders.
 */
function resolveIn(tree: Map<string, Node>, dir: string[], target: string): { at: string } | "outside" | "loops" {
  if (target.startsWith("/")) return "outside";
  const done = [...dir];
  const todo = target.split("/").reverse();
  let hops = 0;
  while (todo.length) {
    const c = todo.pop()!;
    if (c === "" || c === ".") continue;
    if (c === "..") {
      if (!done.length) return "outside";
      done.pop();
      continue;
    }
    done.push(c);
    const node = tree.get(done.join("/"));
    if (node?.kind !== "link") continue;
    if (++hops > MAX_LINK_HOPS) return "loops";
    if (node.target.startsWith("/")) return "outside";
    done.pop();
    todo.push(...node.target.split("/").reverse());
  }
  return { at: done.join("/") || "." };
}

/**
 * The entry checks of a bundle: absolute paths, `..`, devices and sizes over
 * the limits are refused, with the first offending entries named. Links are
 * checked against a model of the tree as the entries build it, whatever their
 * order: a symbolic link must lead inside the bundle once resolved through
 * every other link (those already read, and, in a last pass, those that come
 * later), without looping; no entry may go through a link; a hard link must
 * name a file already in the bundle, not a link and not through one.
 */
function bundleChecker(limits: BundleLimits) {
  const problems: string[] = [];
  /** Links already refused (kept in the tree, so that links through them are refused too). */
  const badLinks = new Set<string>();
  const tree = new Map<string, Node>();
  let entries = 0;
  let total = 0;
  const refuse = (path: string, why: string) => {
    if (problems.length < 5) problems.push(`${JSON.stringify(path)} ${why}`);
  };
  /** The first parent folder of `p` that is a link in the tree, or null. */
  const linkAbove = (p: string): string | null => {
    const parts = p.split("/");
    for (let i = 1; i < parts.length; i++) {
      const up = parts.slice(0, i).join("/");
      if (tree.get(up)?.kind === "link") return up;
    }
    return null;
  };
  const linkProblem = (p: string, target: string): string | null => {
    const r = resolveIn(tree, p.split("/").slice(0, -1), target);
    if (r === "outside") return `is a link to ${JSON.stringify(target)}, which leads outside the bundle`;
    if (r === "loops") return `is a link to ${JSON.stringify(target)}, which loops (or goes more than ${MAX_LINK_HOPS} links deep)`;
    return null;
  };
  const onReadEntry = (entry: tar.ReadEntry) => {
    entries++;
    total += entry.size ?? 0;
    const bad = unsafePath(entry.path);
    if (bad) return refuse(entry.path, bad);
    if (!SAFE_TYPES.has(entry.type)) return refuse(entry.path, `is a ${entry.type}, not a file, folder or link`);
    const p = posix.normalize(entry.path).replace(/\/+$/, "");
    if (p === "." || p === "") {
      if (entry.type !== "Directory") return refuse(entry.path, "would replace the bundle's root folder");
      return;
    }
    const above = linkAbove(p);
    if (above) return refuse(entry.path, `goes through a link (${JSON.stringify(above)})`);
    if (entry.type === "SymbolicLink") {
      const target = entry.linkpath ?? "";
      if (!target || target.includes("\0")) return refuse(entry.path, `is a link to ${JSON.stringify(target)}, outside the bundle`);
      tree.set(p, { kind: "link", target });
      const why = linkProblem(p, target);
      if (why) {
        badLinks.add(p);
        return refuse(entry.path, why);
      }
    } else if (entry.type === "Link") {
      const target = entry.linkpath ?? "";
      const t = target ? posix.normalize(target).replace(/\/+$/, "") : "";
      const why = target ? unsafePath(target) : "is empty";
      if (why || !t || t === ".") return refuse(entry.path, `is a hard link to ${JSON.stringify(target)}, outside the bundle`);
      const via = linkAbove(t);
      if (via) return refuse(entry.path, `is a hard link to ${JSON.stringify(target)}, through the link ${JSON.stringify(via)}`);
      const node = tree.get(t);
      if (node?.kind !== "file") return refuse(entry.path, `is a hard link to ${JSON.stringify(target)}, ${node?.kind === "link" ? "a link" : "not a file before it in the bundle"}`);
      tree.set(p, { kind: "file" });
    } else tree.set(p, { kind: entry.type === "Directory" ? "dir" : "file" });
  };
  /** The last pass, over the whole tree: links that come after an entry count too. */
  const finalPass = () => {
    for (const [p, node] of tree) {
      if (badLinks.has(p)) continue;
      const above = linkAbove(p);
      if (above) refuse(p, `goes through a link (${JSON.stringify(above)})`);
      else if (node.kind === "link") {
        const why = linkProblem(p, node.target);
        if (why) refuse(p, why);
      }
    }
  };
  const verdict = () => {
    finalPass();
    if (problems.length) throw new BundleError(`bundle refused: ${problems.join("; ")}`);
    if (entries > limits.maxEntries) throw new BundleError(`bundle refused: ${entries} entries, over the limit of ${limits.maxEntries}`);
    if (total > limits.maxUnpackedBytes) throw new BundleError(`bundle refused: ${bytes.format(total)} unpacked, over the limit of ${bytes.format(limits.maxUnpackedBytes)} (bundle.max_unpacked, GPULAYER_BUNDLE_MAX_UNPACKED)`);
    return { entries, bytes: total };
  };
  return { onReadEntry, verdict };
}

function checkSize(file: string, limits: BundleLimits): void {
  const size = statSync(file).size;
  if (size > limits.maxBytes) throw new BundleError(`bundle refused: ${bytes.format(size)} is over the limit of ${bytes.format(limits.maxBytes)} (bundle.max_size, GPULAYER_BUNDLE_MAX)`);
}

// The raw header path (preservePaths): no stripping of / or .. before the checks see it.
const LIST = { strict: true, preservePaths: true } as const;

/** Check every entry of a bundle, writing nothing. */
export function inspectBundle(file: string, limits: BundleLimits): { entries: number; bytes: number } {
  checkSize(file, limits);
  const checker = bundleChecker(limits);
  try {
    tar.t({ file, sync: true, ...LIST, onReadEntry: checker.onReadEntry });
  } catch (error) {
    throw new BundleError(`bundle refused: not a valid tar.gz (${(error as Error).message})`);
  }
  return checker.verdict();
}

/** Check, then unpack into `dest` (created; must not exist yet). Asynchronous: a worker keeps heartbeating meanwhile. */
export async function unpackBundle(file: string, dest: string, limits: BundleLimits): Promise<void> {
  checkSize(file, limits);
  const checker = bundleChecker(limits);
  try {
    await tar.t({ file, ...LIST, onReadEntry: checker.onReadEntry });
  } catch (error) {
    throw new BundleError(`bundle refused: not a valid tar.gz (${(error as Error).message})`);
  }
  checker.verdict();
  if (existsSync(dest)) throw new BundleError(`cannot unpack into ${dest}: it exists already`);
  mkdirSync(dest, { recursive: true });
  try {
    await tar.x({ file, cwd: dest, strict: true, preserveOwner: false, noMtime: true });
  } catch (error) {
    rmSync(dest, { recursive: true, force: true });
    throw new BundleError(`unpacking the bundle failed: ${(error as Error).message}`);
  }
}
