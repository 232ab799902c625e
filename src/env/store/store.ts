import { closeSync, existsSync, fsyncSync, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../../config/paths.ts";
import { writeFileAtomic } from "../../core/atomic.ts";
import { openToReaders } from "../../core/owner-only.ts";
import { removeTree } from "../../core/tree-owner.ts";
import type { InputsReport } from "../request/inputs-report.ts";
import type { KeyDocument } from "../request/key.ts";

/** Everything recorded about a ready environment (written before the ready marker). */
export interface EnvMeta {
  key: string;
  path: string;
  python: string;
  created: string;
  buildSeconds: number;
  sizeBytes: number;
  venvCreator: "uv" | "venv";
  installer: string;
  /** `uv (fast path)` or `pip` (absent in envs built before it was recorded). */
  installerPath?: string;
  /** Why the fast path was not taken, when it was not. */
  installerFallback?: string | null;
  summary: string;
  request: KeyDocument;
  /** The inputs the key covers, for people (paths, digests, variable names). */
  inputs?: InputsReport;
  installed: string[];
  check: string[];
  /** A uv project's env: the worker packages it holds the locked version of (env/build/locked-project.ts). */
  shadowed?: { name: string; worker: string; locked: string }[];
  /** Requirements built without isolation: compiled here, or taken from the wheelhouse (env/build/wheelhouse.ts). */
  wheels?: { name: string; wheel: string; from: "compiled" | "wheelhouse" | "fleet"; seconds: number; builtAgainst: string[]; builtBy?: string }[];
  /** Unpacked from another worker's artifact rather than built here (env/store/shipping.ts). */
  fetched?: { sha256: string; bytes: number; seconds: number; built_by: string };
}

/** The wheels' report as documents and events spell it (snake_case); none: nothing to add. */
export function wheelDocs(wheels: EnvMeta["wheels"]): { wheels: { name: string; wheel: string; from: "compiled" | "wheelhouse" | "fleet"; seconds: number; built_against: string[]; built_by?: string }[] } | Record<string, never> {
  if (!wheels?.length) return {};
  return { wheels: wheels.map((w) => ({ name: w.name, wheel: w.wheel, from: w.from, seconds: Number(w.seconds.toFixed(3)), built_against: w.builtAgainst, ...(w.builtBy ? { built_by: w.builtBy } : {}) })) };
}

/** The wheels' report for people: `kernels compiled in 4.1 s against torch==2.1.0+cu121`. */
export function wheelLines(wheels: EnvMeta["wheels"]): string[] {
  return (wheels ?? []).map((w) => `${w.name} ${w.from === "compiled" ? `compiled in ${w.seconds.toFixed(1)} s` : w.from === "fleet" ? `fetched from ${w.builtBy ?? "the fleet"}` : "from the wheelhouse"} (${w.wheel}), built against ${w.builtAgainst.join(", ") || "nothing of the env or the worker"}`);
}

export interface EntryPaths {
  dir: string;
  stateDir: string;
  meta: string;
  ready: string;
  lastUsed: string;
  lock: string;
  /** The installers' temporary folder while the entry builds (their TMPDIR): it goes with the build, killed or not. */
  tmp: string;
}

export function entryPaths(layout: HomeLayout, key: string): EntryPaths {
  const dir = join(layout.envs, key);
  const stateDir = join(dir, ".gpulayer");
  return { dir, stateDir, meta: join(stateDir, "meta.json"), ready: join(stateDir, "ready"), lastUsed: join(stateDir, "last-used"), lock: join(layout.locks, key), tmp: join(layout.envs, `${key}.tmp`) };
}

export function isReady(paths: EntryPaths): boolean {
  return existsSync(paths.ready);
}

/** The last step of a build: meta, then the marker that makes the entry usable. */
export function markReady(paths: EntryPaths, meta: EnvMeta, opts: { openToAll?: boolean; openedAlready?: boolean } = {}): void {
  mkdirSync(paths.stateDir, { recursive: true });
  writeFileAtomic(paths.meta, JSON.stringify(meta, null, 2));
  writeFileAtomic(paths.lastUsed, new Date().toISOString());
  // Built under gpulayer's 077 umask, an env is opened to all: it holds code, no secret, and a --run-as job user runs it.
  // One built as a --run-as user was taken back readable by that user's group alone (build-user.ts): it holds the job's projects.
  // A fetched env was opened entry by entry as it was unpacked (unpack.ts), a built one as it was measured
  // (openAndMeasure): only what was written here since is left.
  if (opts.openToAll ?? true) openToReaders(opts.openedAlready ? paths.stateDir : paths.dir);
  writeFileAtomic(paths.ready, `${meta.key}\n`);
  // The rename must itself be durable before anyone is told the entry is ready.
  const dirFd = openSync(paths.stateDir, "r");
  try {
    fsyncSync(dirFd);
  } finally {
    closeSync(dirFd);
  }
}

/** One timestamp write per reuse: gc orders by this mtime (atime is not trusted). */
export function touchLastUsed(paths: EntryPaths, when = new Date()): void {
  touchFile(paths.lastUsed, when);
}

/** Set a file's mtime, creating it if needed; a file whose folder is gone (gc took the entry) is left alone. */
export function touchFile(path: string, when = new Date()): void {
  try {
    utimesSync(path, when, when);
  } catch {
    try {
      writeFileSync(path, when.toISOString());
    } catch {
      // The entry was removed (gc) between the ready check and now: a reuse without a lease may lose that race.
    }
  }
}

export function lastUsedMs(paths: EntryPaths): number {
  try {
    return statSync(paths.lastUsed).mtimeMs;
  } catch {
    return 0;
  }
}

export function readMeta(paths: EntryPaths): EnvMeta | null {
  try {
    return JSON.parse(readFileSync(paths.meta, "utf8")) as EnvMeta;
  } catch {
    return null;
  }
}

export function listKeys(layout: HomeLayout): string[] {
  return namesInStore(layout).filter((n) => /^[0-9a-f]{64}$/.test(n));
}

/** The store's entries; none before the first build. A store this user may not read is said (errors.ts), never shown as empty. */
export function namesInStore(layout: HomeLayout): string[] {
  try {
    return readdirSync(layout.envs);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw error;
  }
}

/** Keys whose installers' temporary folder is there without the env: a build killed before it made its folder. */
export function orphanTmpKeys(layout: HomeLayout): string[] {
  const names = new Set(namesInStore(layout));
  return [...names].flatMap((n) => (/^[0-9a-f]{64}\.tmp$/.test(n) && !names.has(n.slice(0, 64)) ? [n.slice(0, 64)] : []));
}

/**
 * Take an entry out of the cache: rename it into trash first (atomic, so no
 * reader ever sees a half-deleted env that looks ready), then delete.
 */
export function removeEntryDir(layout: HomeLayout, dir: string): void {
  if (!existsSync(dir)) return;
  mkdirSync(layout.trash, { recursive: true });
  const doomed = join(layout.trash, `${dir.split("/").pop()}.${process.pid}.${Date.now()}`);
  renameSync(dir, doomed);
  removeTree(doomed); // a build's user's tree (worker.run_as): closed before rm walks it
}

/** Finish deletions a crash interrupted. */
export function emptyTrash(layout: HomeLayout): void {
  if (!existsSync(layout.trash)) return;
  for (const name of readdirSync(layout.trash)) removeTree(join(layout.trash, name));
}

/** Bytes on disk, each inode once: what deleting the folder frees. */
export function diskUsage(root: string): number {
  const usage = usageCounter();
  const walk = (p: string) => {
    let s;
    try {
      s = lstatSync(p);
    } catch {
      return;
    }
    if (usage.count(s) && s.isDirectory()) for (const n of readdirSync(p)) walk(join(p, n));
  };
  walk(root);
  return usage.total;
}

/** A built env opened to all (owner-only.ts) and measured as diskUsage measures it, in one walk. */
export function openAndMeasure(dir: string): number {
  const usage = usageCounter();
  openToReaders(dir, (s) => usage.count(s));
  return usage.total;
}

/** Sums each inode's bytes on disk once; count says whether this one was new. */
function usageCounter() {
  const seen = new Set<string>();
  return {
    total: 0,
    count(s: { dev: number; ino: number; blocks: number; size: number }): boolean {
      const id = `${s.dev}:${s.ino}`;
      if (seen.has(id)) return false;
      seen.add(id);
      this.total += s.blocks ? s.blocks * 512 : s.size;
      return true;
    },
  };
}
