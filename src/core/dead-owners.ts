import { readdirSync } from "node:fs";
import { mayBeRunning } from "./process-identity.ts";

/**
 * The names in `dir` that a process left mid-way and is gone from (a temp
 * file or folder named with its pid: `pattern`'s first group). This process's
 * own are never among them, nor any whose pid may still run.
 */
export function namesOfDeadOwners(dir: string, pattern: RegExp): string[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  return names.filter((name) => {
    const pid = Number(pattern.exec(name)?.[1] ?? 0);
    return pid > 0 && pid !== process.pid && !mayBeRunning({ pid, start: null, boot: null });
  });
}
