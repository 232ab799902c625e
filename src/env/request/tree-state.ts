import { accessSync, constants, mkdirSync, readFileSync, type Stats, statSync } from "node:fs";
import { join } from "node:path";
import { writeFileAtomic } from "../../core/atomic.ts";
import { contentHash } from "../../core/hashing.ts";
import { UserError } from "../../errors.ts";

/**
 * The state of the paths a project's walk went by, kept for the next run
 * (tree-digest.ts): one summary file per project root and kind (plain or
 * editable) holding the walk's answer, the paths, and one hash of their
 * state and of what it answers for. The next run stats the same paths, in
 * order, and takes the answer only when the hash is the same.
 */

/** A path the walk went by, relative to the root ("" for the root), and its state then (null: it led nowhere). */
export interface Seen {
  relPath: string;
  stat: Stats | null;
}

/** What a walk answers: the project's digest and how many files count by content. */
export interface WalkAnswer {
  digest: string;
  files: number;
}

interface Summary extends WalkAnswer {
  identity: string;
  paths: string[];
}

/** Bumped when what a summary holds changes: an older one is then not read. */
const SUMMARY_FORMAT = "tree-summary-v4";

/** Why a path cannot be followed to anything: as a dangling link, by name (a link to itself, a file used as a folder). */
const NOTHING_THERE = new Set(["ENOENT", "ELOOP", "ENOTDIR"]);

/** stat(2), or null for a path that leads nowhere (a dangling link); without an options object, which costs Bun's statSync a tenth more per file. */
export function statFollowing(path: string): Stats | null {
  try {
    return statSync(path);
  } catch (error) {
    if (NOTHING_THERE.has((error as NodeJS.ErrnoException).code ?? "")) return null;
    throw error;
  }
}

function summaryFileOf(cacheDir: string, root: string, editable: boolean): string {
  return join(cacheDir, `${contentHash(`${SUMMARY_FORMAT}:${editable}:${root}`).slice(0, 32)}.tree`);
}

/** What a summary answers is in its identity too: one kept for another root or kind, or edited, is not taken. */
function answering(root: string, editable: boolean, answer: WalkAnswer): string {
  return `${SUMMARY_FORMAT}\0${editable}\0${root}\0${answer.digest}\0${answer.files}`;
}

/** The kept answer, when every path the walk went by is as it was then; else null (walk again). */
export function keptAnswer(cacheDir: string, root: string, editable: boolean): WalkAnswer | null {
  const kept = readSummary(summaryFileOf(cacheDir, root, editable));
  if (!kept || kept.identity !== identityNow(root, kept.paths, answering(root, editable, kept))) return null;
  return { digest: kept.digest, files: kept.files };
}

/** Keep a walk's answer with the state of what it went by (states taken before their content was read: a change after that shows next time). */
export function keepAnswer(cacheDir: string, root: string, editable: boolean, seen: Seen[], answer: WalkAnswer): void {
  const paths = seen.map((s) => s.relPath);
  const numbers = new Float64Array(paths.length * 5);
  seen.forEach((s, i) => putState(numbers, i, s.stat));
  try {
    mkdirSync(cacheDir, { recursive: true });
    writeFileAtomic(summaryFileOf(cacheDir, root, editable), summaryText({ identity: identityOf(paths, numbers, answering(root, editable, answer)), ...answer, paths }));
  } catch {
    // not kept: the next run walks the tree
  }
}

/** The latest change among what a walk went by: a summary is kept only once all of it has settled. */
export function newestChange(seen: Seen[]): number {
  let newest = 0;
  for (const { stat } of seen) if (stat) newest = Math.max(newest, stat.mtimeMs, stat.ctimeMs);
  return newest;
}

/**
 * The summary file: a JSON line (identity, digest, files), then the paths joined
 * by NUL, which no file name holds: read on every warm run, and a third of the
 * time of the same as one JSON document.
 */
function readSummary(file: string): Summary | null {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch {
    return null; // none yet: walked below
  }
  const newline = text.indexOf("\n");
  try {
    const head = JSON.parse(text.slice(0, newline)) as Omit<Summary, "paths">;
    if (newline < 0 || typeof head.identity !== "string") return null;
    return { ...head, paths: text.slice(newline + 1).split("\0") };
  } catch {
    return null;
  }
}

function summaryText(summary: Summary): string {
  const { paths, ...head } = summary;
  return `${JSON.stringify(head)}\n${paths.join("\0")}`;
}

/**
 * The state of the paths a walk went by, as they are now; null when one cannot be read (the walk then says why).
 *
 * The stats run from inside the root, the process's working folder for this loop only: the kernel then walks a
 * path's own components, not the root's as well, which is a fifth of a warm check on a big project. No other code
 * sees that working folder: the loop is synchronous (nothing else runs on this thread meanwhile), and gpulayer
 * hands no relative path to a file call (every path is resolved at the top, commands/_context.ts). A root that
 * cannot be entered is stat'ed by absolute paths instead.
 */
function identityNow(root: string, paths: string[], answer: string): string | null {
  const back = enter(root);
  try {
    const numbers = back === null ? statesOf(`${root}/`, root, paths) : statesOf("", ".", paths);
    return numbers && identityOf(paths, numbers, answer);
  } finally {
    if (back !== null) leave(back);
  }
}

/** Into `folder`, returning the working folder to come back to; null (and nowhere) when either step fails. */
function enter(folder: string): string | null {
  try {
    const back = process.cwd();
    accessSync(back, constants.X_OK); // a way back, or no way in
    process.chdir(folder);
    return back;
  } catch {
    return null;
  }
}

function leave(back: string): void {
  try {
    process.chdir(back);
  } catch (error) {
    throw new UserError(`the working folder ${back} went away during the prepare (${(error as NodeJS.ErrnoException).code})`);
  }
}

/** One stat per path, in a bare loop: this loop is the whole warm check, and putState's lines are written out in it (a call per path costs 3% of a 2,000-file warm prepare). */
function statesOf(prefix: string, rootName: string, paths: string[]): Float64Array | null {
  const numbers = new Float64Array(paths.length * 5);
  for (let i = 0; i < paths.length; i++) {
    const rel = paths[i]!;
    const at = i * 5;
    let st: Stats;
    try {
      st = statSync(rel ? prefix + rel : rootName);
    } catch (error) {
      if (!NOTHING_THERE.has((error as NodeJS.ErrnoException).code ?? "")) return null;
      numbers[at] = Number.NaN;
      continue;
    }
    numbers[at] = st.size;
    numbers[at + 1] = st.mtimeMs;
    numbers[at + 2] = st.ctimeMs;
    numbers[at + 3] = st.ino;
    numbers[at + 4] = st.dev;
  }
  return numbers;
}

/** size, mtime, ctime, inode, device of each path (NaN for one that is missing), as raw doubles: formatting them as text would cost more than the stats. statesOf writes the same in its loop. */
function putState(numbers: Float64Array, i: number, st: Stats | null): void {
  const at = i * 5;
  if (!st) {
    numbers[at] = Number.NaN;
    return;
  }
  numbers[at] = st.size;
  numbers[at + 1] = st.mtimeMs;
  numbers[at + 2] = st.ctimeMs;
  numbers[at + 3] = st.ino;
  numbers[at + 4] = st.dev;
}

function identityOf(paths: string[], numbers: Float64Array, answer: string): string {
  const hasher = new Bun.CryptoHasher("sha256");
  hasher.update(answer);
  hasher.update("\0");
  hasher.update(paths.join("\0"));
  hasher.update(numbers);
  return hasher.digest("hex");
}
