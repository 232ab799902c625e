import { linkSync, mkdirSync, readdirSync, readFileSync, readlinkSync, renameSync, rmSync, statSync, utimesSync } from "node:fs";
import { dirname, join } from "node:path";
import { identify, mayBeRunning, ownStartTime, type RecordedProcess, recordedStart } from "./process-identity.ts";
import { endGroup } from "./process-tree.ts";
import { writeFileNamed } from "./atomic.ts";

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
 *
 * A dead owner's lock has exactly one heir. Several waiters find it dead at
 * once; each tries to create `heir-<dead token>` inside the lock with its own
 * record (a hard link of a file written beside it: the name comes into being
 * whole, and only once). The one that makes it holds the lock; it then moves
 * that record onto `owner`. The others see the heir and wait for it. The
 * lock's folder is never moved aside while held, so no waiter can take a
 * live lock out from under its holder. A waiter that read a dead owner late,
 * after the lock was released and taken anew, makes `heir-<dead>` in the new
 * lock: the chain from `owner` then does not end at its record, and it takes
 * its record back. An heir that dies before moving its record is itself the
 * lock's owner as the chain reads it, and has one heir in turn.
 *
 * What a holder started may outlive it: an installer in its own process group
 * goes on writing after a SIGKILL of gpulayer alone. The holder records each
 * such group in the lock (`keep`: a `group-PID` file, with its start time and
 * the holder's token), and whoever finds the holder dead ends those groups
 * and waits for them to be gone before breaking the lock: until then, the
 * lock holds.
 */
/** How often a holder on another machine shows it lives (a lock's owner file, a lease's file: their mtime). */
export const HEARTBEAT_MS = 10_000;
/** Silence after which a holder elsewhere counts as gone. */
export const FOREIGN_STALE_MS = 60_000;

export interface Release {
  (): Promise<void>;
  /** Record a process group started under the lock (its leader's pid); returns the forgetting of it, once it has ended. */
  keep(pid: number): () => void;
}

interface KeptGroup extends RecordedProcess {
  /** The token of the holder that started it: a later holder's groups are never taken for a dead one's. */
  token: string;
}

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
    // The host's name as uname gives it, from /proc: node:os's start-up (0.3 ms) would cost every warm prepare.
    const host = read("/proc/sys/kernel/hostname", (p) => readFileSync(p, "utf8")) || (require("node:os") as typeof import("node:os")).hostname();
    here = [host, read("/proc/sys/kernel/random/boot_id", (p) => readFileSync(p, "utf8")), read("/proc/self/ns/pid", readlinkSync)].join("|");
  }
  return here;
}

function readRecord(file: string): Owner | null {
  try {
    return JSON.parse(readFileSync(file, "utf8")) as Owner;
  } catch {
    return null; // no lock (or one being released this instant)
  }
}

/** The lock's holder as its records say: `owner`, then each heir's record in turn; with the file that holds it. */
function readOwner(dir: string): { owner: Owner; file: string } | null {
  let file = join(dir, "owner");
  let owner = readRecord(file);
  if (!owner) return null;
  // A chain is as long as the heirs that died before moving their record onto `owner`: a bound only against a loop.
  for (let depth = 0; depth < 1000; depth++) {
    const next = join(dir, `heir-${owner.token}`);
    const heir = readRecord(next);
    if (!heir) break;
    [owner, file] = [heir, next];
  }
  return { owner, file };
}

function ownerAlive(held: { owner: Owner; file: string }): boolean {
  const { owner, file } = held;
  // An owner whose start time is unknown holds its lock while its pid runs: only a provably ended one lets go.
  if (owner.where === lockWhere()) return mayBeRunning({ pid: owner.pid, start: recordedStart(owner.start) });
  try {
    return Date.now() - statSync(file).mtimeMs < FOREIGN_STALE_MS;
  } catch {
    return false;
  }
}

const token = () => `${process.pid}-${Math.random().toString(36).slice(2, 10)}`;

/**
 * Become the one heir of a dead holder's lock, or learn that someone else is.
 * `record` is our owner record, written whole beside the lock (same filesystem).
 */
function inherit(dir: string, dead: Owner, me: Owner, record: string): boolean {
  const claim = join(dir, `heir-${dead.token}`);
  try {
    linkSync(record, claim);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    // Another waiter is the heir (EEXIST), or the lock is gone (ENOENT). Anything else (a filesystem without hard links) is said, never taken for a live heir: that would wait forever.
    if (code === "EEXIST" || code === "ENOENT") return false;
    throw error;
  }
  if (readOwner(dir)?.owner.token !== me.token) {
    // The lock we read as dead was released and taken anew before our claim: this claim is in a live lock. Take it back.
    rmSync(claim, { force: true });
    return false;
  }
  try {
    renameSync(claim, join(dir, "owner"));
  } catch {
    // Our record stays the chain's end; release and the heartbeat look it up there.
  }
  return true;
}

/** End the process groups a dead holder recorded; false while some of it still runs. */
async function endKept(dir: string, dead: Owner): Promise<boolean> {
  let names: string[];
  try {
    names = readdirSync(dir).filter((n) => n.startsWith("group-"));
  } catch {
    return true; // broken by someone else meanwhile
  }
  for (const name of names) {
    let kept: KeptGroup;
    try {
      kept = JSON.parse(readFileSync(join(dir, name), "utf8")) as KeptGroup;
    } catch {
      continue; // gone: the group ended and was forgotten
    }
    if (kept.token !== dead.token) continue;
    if (!(await endGroup({ pid: kept.pid, start: recordedStart(kept.start), boot: kept.boot ?? null }))) return false;
  }
  return true;
}

/** Our own temporary record gone, if it can be: a folder we may not write keeps nothing of ours anyway. */
function removeQuietly(tmp: string): void {
  try {
    rmSync(tmp, { recursive: true, force: true });
  } catch {
    // EACCES: the folder refused the mkdir too; the error that matters is that one
  }
}

/** Take the lock now, or return null when a live process holds it. */
export async function tryLock(path: string): Promise<Release | null> {
  const dir = `${path}.lock`;
  mkdirSync(dirname(path), { recursive: true });
  const me: Owner = { pid: process.pid, start: ownStartTime(), where: lockWhere(), token: token() };
  for (let attempt = 0; attempt < 8; attempt++) {
    const tmp = `${dir}.${me.token}.tmp`;
    try {
      mkdirSync(tmp, { recursive: true });
      writeFileNamed(join(tmp, "owner"), JSON.stringify(me));
    } catch (error) {
      // A full disk, say: no half-made lock is left behind (and the error said is the one that stopped it).
      removeQuietly(tmp);
      throw error;
    }
    try {
      renameSync(tmp, dir); // atomic; fails while a lock (a non-empty folder) is there
      return holding(dir, me);
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code !== "ENOTEMPTY" && code !== "EEXIST") {
        removeQuietly(tmp);
        throw error;
      }
    }
    try {
      const held = readOwner(dir);
      if (!held) continue; // released between our two looks
      if (ownerAlive(held)) return null;
      // Another machine's processes cannot be signalled from here; they are its own to end.
      if (held.owner.where === lockWhere() && !(await endKept(dir, held.owner))) return null;
      if (inherit(dir, held.owner, me, join(tmp, "owner"))) return holding(dir, me);
      if (readOwner(dir)?.owner.token !== held.owner.token) continue; // an heir took it, or it was released: look again
      return null;
    } finally {
      removeQuietly(tmp);
    }
  }
  return null;
}

function holding(dir: string, me: Owner): Release {
  const mine = () => {
    const held = readOwner(dir);
    return held?.owner.token === me.token ? held : null;
  };
  const beat = setInterval(() => {
    try {
      const now = new Date();
      const held = mine();
      if (held) utimesSync(held.file, now, now);
    } catch {
      // gone: released, or broken by someone who judged us dead
    }
  }, HEARTBEAT_MS);
  beat.unref();
  const release = async () => {
    clearInterval(beat);
    if (!mine()) return; // not ours any more: leave it be
    const grave = `${dir}.${me.token}.released`;
    try {
      renameSync(dir, grave);
    } catch {
      return;
    }
    rmSync(grave, { recursive: true, force: true });
  };
  const keep = (pid: number) => {
    if (!mine()) return () => {};
    const file = join(dir, `group-${pid}`);
    const kept: KeptGroup = { pid, ...identify(pid), token: me.token };
    // Written whole (temp, rename): a breaker reads all of it or nothing. No fsync: after a reboot the record means nothing.
    writeFileNamed(`${file}.tmp`, JSON.stringify(kept));
    renameSync(`${file}.tmp`, file);
    return () => rmSync(file, { force: true });
  };
  return Object.assign(release, { keep });
}

/** The pid of the live process that holds the lock, if one does. */
export function lockHolder(path: string): number | null {
  const dir = `${path}.lock`;
  const held = readOwner(dir);
  return held !== null && ownerAlive(held) ? held.owner.pid : null;
}

/** Whether a live process holds the lock. */
export async function isLocked(path: string): Promise<boolean> {
  const dir = `${path}.lock`;
  const held = readOwner(dir);
  return held !== null && ownerAlive(held);
}
