import { readdirSync } from "node:fs";
import { readProcStat } from "./process-identity.ts";

/**
 * SIGKILL a process and everything it started (pip's build backends, uv's
 * workers), found by their parent links in /proc: the tools stay in our own
 * process group, so a terminal's Ctrl-C or a group kill still reaches them,
 * and a time limit still reaches all of them. Scanned until none is left,
 * since a child may fork while its siblings die. Without /proc: the process alone.
 */
export function killTree(root: number): void {
  for (let round = 0; round < 5; round++) {
    const tree = descendants(root);
    if (round > 0 && !tree.length) return;
    for (const pid of [root, ...tree]) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone already
      }
    }
  }
}

function descendants(root: number): number[] {
  let pids: number[];
  try {
    pids = readdirSync("/proc").filter((n) => /^\d+$/.test(n)).map(Number);
  } catch {
    return [];
  }
  const children = new Map<number, number[]>();
  for (const pid of pids) {
    const stat = readProcStat(pid);
    if (!stat || stat.state === "Z") continue;
    children.set(stat.ppid, [...(children.get(stat.ppid) ?? []), pid]);
  }
  const found: number[] = [];
  const queue = [...(children.get(root) ?? [])];
  while (queue.length) {
    const pid = queue.shift()!;
    found.push(pid);
    queue.push(...(children.get(pid) ?? []));
  }
  return found;
}
