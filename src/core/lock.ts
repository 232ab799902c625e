import { mkdirSync, readdirSync, readFileSync, readlinkSync, renameSync, rmSync, statSync, utimesSync } from "node:fs";
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
 * What a holder started may outlive it: an installer in its own process group
 * goes on writing after a SIGKILL of gpulayer alone. The holder records each
 * such group in the lock (`keep`: a `group-PID` file, with its start time and
 * the holder's token), and whoever finds the holder dead ends those groups
 * and waits for them to be gone before breaking the lock: until then, the
 * lock holds.
 */
const HEARTBEAT_MS = 10_000;
const FOREIGN_STALE_MS = 60_000;

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
    // node:os loaded here, at the first lock record: its start-up would cost every warm prepare.
    const { hostname } = require("node:os") as typeof import("node:os");
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
      // A full disk, say: no half-made lock is left behind.
      rmSync(tmp, { recursive: true, force: true });
      throw error;
    }
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
    // Another machine's processes cannot be signalled from here; they are its own to end.
    if (owner.where === lockWhere() && !(await endKept(dir, owner))) return null;
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
  const release = async () => {
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
  const keep = (pid: number) => {
    if (readOwner(dir)?.token !== me.token) return () => {};
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
  const owner = readOwner(dir);
  return owner !== null && ownerAlive(dir, owner) ? owner.pid : null;
}

/** Whether a live process holds the lock. */
export async function isLocked(path: string): Promise<boolean> {
  const dir = `${path}.lock`;
  const owner = readOwner(dir);
  return owner !== null && ownerAlive(dir, owner);
}
