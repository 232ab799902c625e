import { chmodSync, type Dirent, lchownSync, lstatSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";

/**
 * Handing a folder to another user and taking it back, as root, without
 * being led out of it. No walk follows a link (lchown, lstat), and none
 * reads a folder the other user can change: giving goes bottom-up, taking
 * back top-down, locking each folder (ours, no write for others) before it
 * is read, so no entry can be swapped for a link to elsewhere between our
 * look and our change, whatever the other user's processes do.
 */

/**
 * Every entry under `dir`, `dir` too, made `uid:gid` (a tree only we have
 * written so far). Bottom-up: a folder is given only once all it holds is,
 * so the user never holds a folder that we still read.
 */
export function giveTree(dir: string, uid: number, gid: number): void {
  if (lstatSync(dir).isDirectory()) {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, e.name);
      if (e.isDirectory()) giveTree(path, uid, gid);
      else lchownSync(path, uid, gid);
    }
  }
  lchownSync(dir, uid, gid);
}

/**
 * Take back a tree the user `uid` wrote: each of its entries becomes ours
 * with group `gid`, which may read and run what the owner may and write
 * nothing; others get nothing; set-id bits go. Entries that are not the
 * user's (a hard link to another's file) are left as they are: never given
 * to the user's group.
 */
export function reclaimTree(dir: string, uid: number, gid: number): void {
  const st = lstatSync(dir);
  if (st.uid === uid) {
    lchownSync(dir, process.getuid?.() ?? 0, gid);
    if (!st.isSymbolicLink()) chmodSync(dir, (st.mode & 0o700) | ((st.mode & 0o500) >> 3));
  }
  if (!st.isDirectory()) return;
  if (st.uid !== uid) lockFolder(dir); // not the user's, yet inside: never left open to them while we read it
  for (const e of readdirSync(dir)) reclaimTree(join(dir, e), uid, gid);
}

/** Before removing a tree another user wrote: every folder in it ours and closed, top-down, so `rm` is never led out. */
export function lockDown(dir: string): void {
  const me = process.getuid?.();
  if (me !== 0) return; // only root can have another user's tree to remove, and only root can change it
  let entries: Dirent[];
  try {
    if (!lstatSync(dir).isDirectory()) return;
    lockFolder(dir);
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return; // gone: nothing to remove
  }
  for (const e of entries) if (e.isDirectory()) lockDown(join(dir, e.name));
}

/**
 * Remove a tree that another user may have written (a worker.run_as build
 * or job): locked down first, then removed, so no link it left leads `rm`
 * elsewhere. Gone already is fine.
 */
export function removeTree(dir: string): void {
  lockDown(dir);
  rmSync(dir, { recursive: true, force: true });
}

function lockFolder(dir: string): void {
  const st = lstatSync(dir);
  const me = process.getuid?.() ?? 0;
  if (st.uid !== me) lchownSync(dir, me, st.gid);
  if (st.uid !== me || st.mode & 0o022) chmodSync(dir, st.mode & 0o755);
}
