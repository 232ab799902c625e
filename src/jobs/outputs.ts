import { closeSync, constants, copyFileSync, lstatSync, mkdirSync, openSync, readdirSync, readSync, renameSync, rmSync } from "node:fs";
import { dirname, join, posix } from "node:path";

/**
 * Files between tasks: what a task declares it leaves (`outputs:`, paths or
 * globs relative to its folder), found in that folder when it succeeds, kept
 * apart from it (a copy: what a later task writes never changes it), and put
 * at the same relative paths in the folder of every task that needs it,
 * directly or through others, before that task starts. Pure functions over
 * folders; where the copies are kept (the job store, the server) is the
 * caller's.
 */

import type { OutputFile } from "./model.ts";

export type { OutputFile };

const GLOB = /[*?[\]{}]/;

/**
 * Whether each folder on the way from `root` to `rel` is a folder and no
 * link: a link anywhere on the path (`d -> /elsewhere`, `d/secret`) would
 * make a file outside the task's folder one of its outputs.
 */
function inside(root: string, rel: string): boolean {
  let at = root;
  for (const part of rel.split("/").slice(0, -1)) {
    at = join(at, part);
    if (!lstatSync(at, { throwIfNoEntry: false })?.isDirectory()) return false;
  }
  return true;
}

/** Every file under `dir` (links and other non-files left out), relative, sorted. */
function filesUnder(root: string, rel: string): OutputFile[] {
  const out: OutputFile[] = [];
  for (const name of readdirSync(join(root, rel)).sort()) {
    const path = rel ? `${rel}/${name}` : name;
    const st = lstatSync(join(root, path));
    if (st.isDirectory()) out.push(...filesUnder(root, path));
    else if (st.isFile()) out.push({ path, bytes: st.size });
  }
  return out;
}

/**
 * The files the declared outputs name in `dir`: a plain path is a file (or
 * every file of a folder) and must be there; a glob may match nothing. Links
 * are never outputs, nor is anything reached through one (a link could name a
 * file outside the folder): such a path counts as missing.
 */
export function collectOutputs(dir: string, declared: string[]): { files: OutputFile[]; missing: string[] } {
  const found = new Map<string, number>();
  const missing: string[] = [];
  for (const raw of declared) {
    const p = posix.normalize(raw).replace(/\/$/, "");
    if (GLOB.test(p)) {
      for (const match of new Bun.Glob(p).scanSync({ cwd: dir, onlyFiles: true, dot: true, followSymlinks: false })) {
        const rel = match.split("\\").join("/");
        const st = inside(dir, rel) ? lstatSync(join(dir, rel), { throwIfNoEntry: false }) : undefined;
        if (st?.isFile()) found.set(rel, st.size);
      }
      continue;
    }
    const st = inside(dir, p) ? lstatSync(join(dir, p), { throwIfNoEntry: false }) : undefined;
    if (st?.isFile()) found.set(p, st.size);
    else if (st?.isDirectory()) for (const f of filesUnder(dir, p)) found.set(f.path, f.bytes);
    else missing.push(raw);
  }
  const files = [...found].map(([path, bytes]) => ({ path, bytes })).sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  return { files, missing };
}

/** The one line a task fails with when an output it declared is not there at its end. */
export function missingOutputLine(task: string, missing: string[]): string {
  return `task ${task}: declared output${missing.length > 1 ? "s" : ""} ${missing.join(", ")} ${missing.length > 1 ? "are" : "is"} missing`;
}

/** The one line a task fails with (in task.prepare) when what the tasks it needs left cannot be put in its folder, here or on a worker. */
export function inputsUnplacedLine(task: string, message: string): string {
  return `task ${task}: the outputs of the tasks it needs could not be put in its folder: ${message}`;
}

const CHUNK = 64 * 1024;

/**
 * Whether `to` is a file that holds exactly the bytes of `from`: the same
 * file (device and inode), else the same size and bytes, read a chunk at a
 * time (outputs may be larger than memory).
 */
export function sameFile(from: string, to: string): boolean {
  const b = lstatSync(to, { throwIfNoEntry: false });
  const a = lstatSync(from, { throwIfNoEntry: false });
  if (!a?.isFile() || !b?.isFile()) return false;
  if (a.dev === b.dev && a.ino === b.ino) return true;
  if (a.size !== b.size) return false;
  const fa = openSync(from, "r");
  try {
    const fb = openSync(to, "r");
    try {
      const ba = Buffer.allocUnsafe(CHUNK);
      const bb = Buffer.allocUnsafe(CHUNK);
      for (;;) {
        const n = readSync(fa, ba, 0, CHUNK, null);
        if (n === 0) return readSync(fb, bb, 0, 1, null) === 0;
        let m = 0;
        while (m < n) {
          const r = readSync(fb, bb, m, n - m, null);
          if (r === 0) return false;
          m += r;
        }
        if (!ba.subarray(0, n).equals(bb.subarray(0, n))) return false;
      }
    } finally {
      closeSync(fb);
    }
  } finally {
    closeSync(fa);
  }
}

/**
 * Copies each file from `fromDir` to the same relative path in `toDir`: a
 * reflink where the filesystem has them, else a copy (never a hard link: the
 * two must not change together). Each lands whole (temporary file, rename),
 * over a link or file there before; a file with the same bytes is left as it is.
 */
export function copyOutputs(fromDir: string, files: OutputFile[], toDir: string): void {
  for (const f of files) {
    const from = join(fromDir, f.path);
    const to = join(toDir, f.path);
    if (sameFile(from, to)) continue;
    mkdirSync(dirname(to), { recursive: true });
    const tmp = `${to}.${process.pid}.${crypto.randomUUID().slice(0, 8)}.gpulayer-tmp`;
    try {
      copyFileSync(from, tmp, constants.COPYFILE_FICLONE);
      renameSync(tmp, to);
    } catch (error) {
      rmSync(tmp, { force: true });
      throw error;
    }
  }
}

/** Every file a kept copy holds (what an unpacked outputs archive has). */
export function keptFiles(dir: string): OutputFile[] {
  return lstatSync(dir, { throwIfNoEntry: false })?.isDirectory() ? filesUnder(dir, "") : [];
}

/** The tasks `name` needs, directly or through others, in the job's order of tasks. */
export function neededTasks(tasks: { name: string; needs: string[] }[], name: string): string[] {
  const needs = new Map(tasks.map((t) => [t.name, t.needs]));
  const seen = new Set<string>();
  const visit = (n: string) => {
    for (const m of needs.get(n) ?? []) {
      if (seen.has(m)) continue;
      seen.add(m);
      visit(m);
    }
  };
  visit(name);
  return tasks.map((t) => t.name).filter((n) => seen.has(n));
}
