import type { HomeLayout } from "../../config/paths.ts";
import { type Release, tryLock } from "../../core/lock.ts";
import { sleep } from "../../core/sleep.ts";
import { type Lease, takeLease } from "../../core/lease.ts";

/**
 * One cache entry (an env, an image) made at most once at a time across
 * processes, and reused once made. The order is the whole point:
 *
 * 1. the lease first (for a job), so gc, which takes the entry's lock and
 *    then checks leases, can never take the entry between the look and its use;
 * 2. look (`reuse`): ready, then it is the answer;
 * 3. else the lock: held by another live process (a build, a pull, gc
 *    removing it), then say so once (`onWait`), wait, and go back to 2;
 *    a dead holder's lock is broken by `tryLock` itself, once the process
 *    groups it recorded (its installers) are gone;
 * 4. holding it, look again (whoever held it may have made it), else `build`,
 *    which records with the lock each process group it starts (`keep`).
 *
 * A live holder is waited for until `signal` aborts (the caller's time
 * limit, a cancel); a dead one holds nothing. On any failure the lease is
 * released and the error goes on.
 */

/** Where a look happens: before taking the lock or holding it; `waited`: another process held the lock at least once. */
export interface Look {
  locked: boolean;
  waited: boolean;
}

export interface LeaseRequest {
  layout: HomeLayout;
  kind: "env" | "image";
  id: string;
  holder: string;
}

export interface EntryAcquisition<T> {
  /** Take a lease on the entry before the first look; handed back with the entry, released here on failure. */
  lease?: LeaseRequest;
  /** The entry's lock path (core/lock.ts). */
  lock: string;
  /** The entry as reused, or null when it is not ready (or not to be looked at now). May throw: "not here, and may not be made". */
  reuse(look: Look): Promise<T | null> | T | null;
  /** Make the entry, holding the lock; `keep` records a process group it starts (core/lock.ts). */
  build(lock: { keep: Release["keep"] }): Promise<T>;
  /** Another process holds the lock: called once, before the first wait. */
  onWait?(): void;
  /** How often the lock is tried again while another process holds it. */
  pollMs?: number;
  /** Stops the waiting (its reason is thrown); the build watches it itself. */
  signal?: AbortSignal;
}

export interface Acquired<T> {
  entry: T;
  /** The lease asked for, held: the caller releases it when done with the entry. */
  lease: Lease | undefined;
}

export async function acquireEntry<T>(a: EntryAcquisition<T>): Promise<Acquired<T>> {
  const lease = a.lease ? takeLease(a.lease.layout, a.lease.kind, a.lease.id, a.lease.holder) : undefined;
  try {
    let waited = false;
    for (;;) {
      const ready = await a.reuse({ locked: false, waited });
      if (ready != null) return { entry: ready, lease };
      const release = await tryLock(a.lock);
      if (!release) {
        if (!waited) a.onWait?.();
        waited = true;
        a.signal?.throwIfAborted();
        await sleep(a.pollMs ?? 150);
        a.signal?.throwIfAborted();
        continue;
      }
      try {
        const made = await a.reuse({ locked: true, waited });
        return { entry: made ?? (await a.build({ keep: release.keep })), lease };
      } finally {
        await release();
      }
    }
  } catch (error) {
    lease?.release();
    throw error;
  }
}
