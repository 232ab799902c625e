import { existsSync, readFileSync } from "node:fs";

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
