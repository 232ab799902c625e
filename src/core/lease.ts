import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { jobProcesses } from "./job-processes.ts";
import { FOREIGN_STALE_MS, HEARTBEAT_MS, lockWhere } from "./lock.ts";
import { identify, mayBeRunning, recordedStart } from "./process-identity.ts";

/**
 * A lease says "a live process uses this entry": a file named after the
 * holder's pid, holding its start time and boot (core/process-identity.ts). gc treats an entry with a live lease as in
 * use; leases of dead processes are ignored and swept, so a SIGKILLed job
 * never pins an entry forever.
 *
 * On a home shared by machines (NFS), a lease taken elsewhere names a pid
 * that means nothing here: it records where it was taken (host, boot, pid
 * namespace, as locks do), its holder refreshes the file's mtime every
 * HEARTBEAT_MS, and elsewhere it counts as live until that stops for
 * FOREIGN_STALE_MS.
 *
 * A contract with integrations/ray: its Ray workers write `<pid>-ray` here
 * from a shell, `{"pid": N, "holder": "..."}` and nothing else; such a lease
 * holds while that pid runs on this machine.
 */
/** Where leases live: `$GPULAYER_HOME/leases` (a HomeLayout is one). */
export interface LeaseHome {
  leases: string;
}

export interface Lease {
  file: string;
  release(): void;
}

/** `job`: the lease also holds while any process with that job's mark lives (core/job-processes.ts), after `pid` is gone. */
export function takeLease(layout: LeaseHome, kind: "env" | "image" | "bundle", id: string, holder: string, pid = process.pid, job?: string): Lease {
  const dir = join(layout.leases, kind, id);
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${pid}-${Math.random().toString(36).slice(2, 8)}`);
  writeFileSync(file, JSON.stringify({ pid, ...identify(pid), where: lockWhere(), holder, since: new Date().toISOString(), ...(job ? { job } : {}) }));
  const beat = setInterval(() => {
    try {
      const now = new Date();
      utimesSync(file, now, now);
    } catch {
      // swept by someone who judged us gone, or released
    }
  }, HEARTBEAT_MS);
  beat.unref();
  return {
    file,
    release() {
      clearInterval(beat);
      rmSync(file, { force: true });
    },
  };
}

/** The live holders of an entry; dead ones are removed on the way. */
export function liveLeases(layout: LeaseHome, kind: "env" | "image" | "bundle", id: string): string[] {
  const dir = join(layout.leases, kind, id);
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  const holders: string[] = [];
  for (const name of names) {
    const file = join(dir, name);
    try {
      const lease = JSON.parse(readFileSync(file, "utf8")) as { pid: number; start?: unknown; boot?: string | null; where?: string; holder: string; job?: string };
      // Taken on another machine (or pid namespace): its heartbeat says, never its pid. Leases older than `where` are this machine's.
      if (lease.where !== undefined && lease.where !== lockWhere()) {
        if (Date.now() - statSync(file).mtimeMs < FOREIGN_STALE_MS) holders.push(lease.holder);
        else rmSync(file, { force: true });
        continue;
      }
      // A holder whose start time is unknown (or unreadable) still holds while its pid runs; only a provably ended one is swept.
      if (mayBeRunning({ pid: lease.pid, start: recordedStart(lease.start), boot: lease.boot ?? null })) holders.push(lease.holder);
      // A job's main process gone, what it started still running (its runner was SIGKILLed, say): still in use.
      else if (lease.job && jobProcesses(lease.job).length) holders.push(lease.holder);
      else rmSync(file, { force: true });
    } catch {
      // written this instant or garbage; a fresh file counts as live
      holders.push("unknown");
    }
  }
  // A job holds an entry once whatever its leases (its runner's and its task's): named once.
  return [...new Set(holders)];
}
