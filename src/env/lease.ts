import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";

/**
 * A lease says "a live process uses this entry": a file named after the
 * holder's pid and start time. gc treats an entry with a live lease as in
 * use; leases of dead processes are ignored and swept, so a SIGKILLed job
 * never pins an entry forever.
 */
export interface Lease {
  file: string;
  release(): void;
}

/** The process's start time (Linux), so a reused pid is not mistaken for the holder. */
export function processStart(pid: number): string {
  return procStat(pid)?.[19] ?? "";
}

/** Fields of /proc/PID/stat after the command name: [0] is the state, [19] the start time. */
function procStat(pid: number): string[] | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  } catch {
    return null;
  }
}

/** Whether the process that started at `start` still runs (a zombie, killed but not yet reaped, does not). */
export function isAlive(pid: number, start: string): boolean {
  try {
    process.kill(pid, 0);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "EPERM") return false;
  }
  if (!existsSync("/proc")) return true;
  const stat = procStat(pid);
  if (!stat) return false;
  if (stat[0] === "Z" || stat[0] === "X") return false;
  return !start || stat[19] === start;
}

export function takeLease(layout: HomeLayout, kind: "env" | "image", id: string, holder: string, pid = process.pid): Lease {
  const dir = join(layout.leases, kind, id);
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${pid}-${Math.random().toString(36).slice(2, 8)}`);
  writeFileSync(file, JSON.stringify({ pid, start: processStart(pid), holder, since: new Date().toISOString() }));
  return {
    file,
    release() {
      rmSync(file, { force: true });
    },
  };
}

/** The live holders of an entry; dead ones are removed on the way. */
export function liveLeases(layout: HomeLayout, kind: "env" | "image", id: string): string[] {
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
      const lease = JSON.parse(readFileSync(file, "utf8")) as { pid: number; start: string; holder: string };
      if (isAlive(lease.pid, lease.start)) holders.push(lease.holder);
      else rmSync(file, { force: true });
    } catch {
      // written this instant or garbage; a fresh file counts as live
      holders.push("unknown");
    }
  }
  return holders;
}
