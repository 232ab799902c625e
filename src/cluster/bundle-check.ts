import bytes from "bytes";
import { createReadStream, statSync } from "node:fs";
import { posix } from "node:path";
import { createGunzip } from "node:zlib";
import * as tar from "tar";
import { BundleError } from "../errors.ts";
import type { BundleLimits } from "./bundle-limits.ts";

/**
 * Checking a bundle before anything of it is trusted: every entry's path,
 * type and link, and the limits. It streams: the file is inflated 64 KiB at
 * a time and each piece is parsed as it comes, so memory stays small
 * whatever the archive claims, the event loop turns between pieces (a server
 * checking an upload keeps answering), and a bomb is refused as soon as what
 * was read passes a limit, not after it has been inflated whole.
 */

/** How long a check may take before the bundle is refused: a bound on the CPU one upload can cost. */
export const CHECK_BUDGET_MS = 120_000;
/** What may follow the archive's end marker: tar pads to a 10 KiB record; anything past that is not ours. */
const TRAILER_SLACK = 64 * 1024;
const PIECE = 64 * 1024;
/** Per entry, beyond its content: its header, its padding and a long-name record. */
const PER_ENTRY = 4096;

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
  /** The limits, as soon as what was read passes one: a bomb is refused before the rest of it is inflated. */
  const overLimits = (): string | null => {
    if (entries > limits.maxEntries) return `bundle refused: more than ${limits.maxEntries} entries`;
    if (total > limits.maxUnpackedBytes) return `bundle refused: more than ${bytes.format(limits.maxUnpackedBytes)} unpacked (bundle.max_unpacked, GPULAYER_BUNDLE_MAX_UNPACKED)`;
    return null;
  };
  return { onReadEntry, verdict, overLimits, entries: () => entries };
}

function checkSize(file: string, limits: BundleLimits): void {
  const size = statSync(file).size;
  if (size > limits.maxBytes) throw new BundleError(`bundle refused: ${bytes.format(size)} is over the limit of ${bytes.format(limits.maxBytes)} (bundle.max_size, GPULAYER_BUNDLE_MAX)`);
}


/** The file, inflated a piece at a time as the reader asks (what it claims never sits in memory whole). */
export function inflating(file: string) {
  const source = createReadStream(file, { highWaterMark: PIECE });
  const gunzip = createGunzip({ chunkSize: PIECE });
  source.on("error", (e) => gunzip.destroy(e));
  source.pipe(gunzip);
  return { source, gunzip };
}

export interface InspectOptions {
  /** Refuse the bundle once checking has taken this long (CHECK_BUDGET_MS). */
  budgetMs?: number;
}

/** Check every entry of a bundle, writing nothing; refused with one BundleError naming the problems. */
export async function inspectBundle(file: string, limits: BundleLimits, opts: InspectOptions = {}): Promise<{ entries: number; bytes: number }> {
  checkSize(file, limits);
  const budgetMs = opts.budgetMs ?? CHECK_BUDGET_MS;
  const checker = bundleChecker(limits);
  let parseError: Error | null = null;
  let ended = false;
  // strict: a damaged header is an error, not a warning; the raw header path is what the checks see.
  const parser = new tar.Parser({
    strict: true,
    onReadEntry: (entry) => {
      checker.onReadEntry(entry);
      entry.resume();
    },
  });
  parser.on("error", (e: Error) => (parseError ??= e));
  parser.on("eof", () => (ended = true));
  const { source, gunzip } = inflating(file);
  const started = Date.now();
  let inflated = 0;
  let trailing = 0;
  const refused = (why: string) => new BundleError(why);
  try {
    for await (const piece of gunzip as AsyncIterable<Buffer>) {
      inflated += piece.length;
      if (ended) trailing += piece.length;
      else parser.write(piece);
      if (parseError) break;
      const over = checker.overLimits();
      if (over) throw refused(over);
      if (trailing > TRAILER_SLACK) throw refused(`bundle refused: more than ${bytes.format(TRAILER_SLACK)} of data after the archive's end`);
      if (inflated > limits.maxUnpackedBytes + PER_ENTRY * (checker.entries() + 16)) throw refused(`bundle refused: inflates to more than ${bytes.format(limits.maxUnpackedBytes)} (bundle.max_unpacked, GPULAYER_BUNDLE_MAX_UNPACKED)`);
      if (Date.now() - started > budgetMs) throw refused(`bundle refused: checking it took longer than ${budgetMs / 1000} s`);
    }
  } catch (error) {
    if (error instanceof BundleError) throw error;
    throw refused(`bundle refused: not a valid tar.gz (${(error as Error).message})`);
  } finally {
    source.destroy();
    gunzip.destroy();
  }
  if (!parseError) parser.end();
  if (parseError) throw refused(`bundle refused: not a valid tar.gz (${(parseError as Error).message})`);
  if (!ended) throw refused("bundle refused: not a valid tar.gz (it ends before the archive's end marker)");
  return checker.verdict();
}
