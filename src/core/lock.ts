import { mkdirSync, readFileSync, readlinkSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { hostname } from "node:os";
import { dirname, join } from "node:path";
import { mayBeRunning, ownStartTime, recordedStart } from "./process-identity.ts";

/**
 * Exclusive locks across processes. A lock is the folder `PATH.lock` holding
 * an `owner` file (pid, process start time, where it runs); it comes into
 * being whole, by renaming a prepared folder into place, so no one ever sees
 * a lock without its owner.
 *
 * A lock whose owner is dead (SIGKILL, crash) is broken at once: on this
 * machine and in this pid namespace liveness is asked of the kernel, so a
 * live builder blocked for minutes keeps its lock and a dead one holds
 * nothing. An owner elsewhere (another host or container sharing the home)
 * cannot be asked; its lock counts as dead once its heartbeat (the owner
 * file's mtime, refreshed every HEARTBEAT_MS) is older than FOREIGN_STALE_MS.
 */
const HEARTBEAT_MS = 10_000;
const FOREIGN_STALE_MS = 60_000;

export type Release = () => Promise<void>;

interface Owner {
  pid: number;
  /** Its start time (process-identity.ts); null when it could not be read. Older owners wrote it as a string. */
  start: number | string | null;
  /** Host, boot and pid namespace: where `pid` means something. */
  where: string;
  token: string;
}

let here: string | undefined;
/** This process's host, boot and pid namespace, as owner records spell it. */
export function lockWhere(): string {
  if (here === undefined) {
    const read = (f: string, fn: (p: string) => string) => {
      try {
        return fn(f).trim();
      } catch {
        return "";
      }
    };
    here = [hostname(), read("/proc/sys/kernel/random/boot_id", (p) => readFileSync(p, "utf8")), read("/proc/self/ns/pid", readlinkSync)].join("|");
  }
  return here;
}

function readOwner(dir: string): Owner | null {
  try {
    return JSON.parse(readFileSync(join(dir, "owner"), "utf8")) as Owner;
  } catch {
    return null; // no lock (or one being broken this instant)
  }
}

function ownerAlive(dir: string, owner: Owner): boolean {
  // An owner whose start time is unknown holds its lock while its pid runs: only a provably ended one lets go.
  if (owner.where === lockWhere()) return mayBeRunning({ pid: owner.pid, start: recordedStart(owner.start) });
  try {
    return Date.now() - statSync(join(dir, "owner")).mtimeMs < FOREIGN_STALE_MS;
  } catch {
    return false;
  }
}

const token = () => `${process.pid}-${Math.random().toString(36).slice(2, 10)}`;

/** Take a dead owner's lock out of the way; if the one taken turns out to be a new, live lock, put it back. */
function breakLock(dir: string, dead: Owner): void {
  const grave = `${dir}.${token()}.stale`;
  try {
    renameSync(dir, grave);
  } catch {
    return; // someone else broke it first
  }
  const taken = readOwner(grave);
  if (taken && taken.token !== dead.token) {
    try {
      renameSync(grave, dir);
      return;
    } catch {
      // A third process locked meanwhile; the one taken will find its lock gone at release.
    }
  }
  rmSync(grave, { recursive: true, force: true });
}

/** Take the lock now, or return null when a live process holds it. */
export async function tryLock(path: string): Promise<Release | null> {
  const dir = `${path}.lock`;
  mkdirSync(dirname(path), { recursive: true });
  const me: Owner = { pid: process.pid, start: ownStartTime(), where: lockWhere(), token: token() };
  for (let attempt = 0; attempt < 8; attempt++) {
    const tmp = `${dir}.${me.token}.tmp`;
    mkdirSync(tmp, { recursive: true });
    writeFileSync(join(tmp, "owner"), JSON.stringify(me));
    try {
      renameSync(tmp, dir); // atomic; fails while a lock (a non-empty folder) is there
      return holding(dir, me);
    } catch (error) {
      rmSync(tmp, { recursive: true, force: true });
      const code = (error as NodeJS.ErrnoException).code;
      if (code !== "ENOTEMPTY" && code !== "EEXIST") throw error;
    }
    const owner = readOwner(dir);
    if (!owner) continue; // released (or being broken) between our two looks
    if (ownerAlive(dir, owner)) return null;
    breakLock(dir, owner);
  }
  return null;
}

function holding(dir: string, me: Owner): Release {
  const ownerFile = join(dir, "owner");
  const beat = setInterval(() => {
    try {
      const now = new Date();
      utimesSync(ownerFile, now, now);
    } catch {
      // gone: released, or broken by someone who judged us dead
    }
  }, HEARTBEAT_MS);
  beat.unref();
  return async () => {
    clearInterval(beat);
    if (readOwner(dir)?.token !== me.token) return; // not ours any more: leave it be
    const grave = `${dir}.${me.token}.released`;
    try {
      renameSync(dir, grave);
    } catch {
      return;
    }
    rmSync(grave, { recursive: true, force: true });
  };
}

/** Whether a live process holds the lock. */
export async function isLocked(path: string): Promise<boolean> {
  const dir = `${path}.lock`;
  const owner = readOwner(dir);
  return owner !== null && ownerAlive(dir, owner);
}
