import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import lockfile from "proper-lockfile";

/**
 * Exclusive locks across processes (proper-lockfile: an atomic mkdir whose
 * mtime the holder refreshes). A holder that dies (SIGKILL, power loss) stops
 * refreshing, and after STALE_MS the next taker breaks the lock.
 */
const STALE_MS = 5000;
const UPDATE_MS = 1000;

export type Release = () => Promise<void>;

/** Take the lock now, or return null when another process holds it. */
export async function tryLock(path: string): Promise<Release | null> {
  mkdirSync(dirname(path), { recursive: true });
  try {
    return await lockfile.lock(path, {
      realpath: false,
      stale: STALE_MS,
      update: UPDATE_MS,
      retries: 0,
      // A lock lost under us (the machine froze past STALE_MS) must not crash the process.
      onCompromised: () => {},
    });
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ELOCKED") return null;
    throw error;
  }
}

export function isLocked(path: string): Promise<boolean> {
  return lockfile.check(path, { realpath: false, stale: STALE_MS });
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
