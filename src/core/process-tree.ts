import { readdirSync } from "node:fs";
import { bootId, liveness, readProcStat, type RecordedProcess, signalRecorded } from "./process-identity.ts";
import { sleep } from "./sleep.ts";

/**
 * SIGKILL a process and everything it started (pip's build backends, uv's
 * workers), found by their parent links in /proc, so a time limit reaches
 * even a child that left the tool's process group. Scanned until none is left,
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

/**
 * End a recorded process group (a tool that led its own group, left running
 * by a gpulayer that died) and wait until none of it runs: SIGKILL to the
 * group while its leader is still the recorded process (its start time), and
 * to members a dead leader left behind that started no earlier than it (a
 * pgid stays taken while any member lives, so those are the group's own).
 * Zombies count as gone: they write nothing. False when some of it still
 * runs after `timeoutMs` (a process stuck in the kernel).
 */
export async function endGroup(p: RecordedProcess, timeoutMs = 10_000): Promise<boolean> {
  if (p.pid === null || p.start === null) return true; // nothing that can be told apart from another process: never signalled
  const boot = bootId();
  if (p.boot && boot && p.boot !== boot) return true; // rebooted since: all of it ended, and its start ticks mean nothing now
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    signalRecorded(p, "SIGKILL", { group: true });
    const left = groupMembers(p.pid, p.start);
    for (const pid of left) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone already
      }
    }
    if (liveness(p) === "gone" && !left.length) return true;
    if (Date.now() > deadline) return false;
    await sleep(50);
  }
}

function groupMembers(pgrp: number, since: number): number[] {
  return procPids().filter((pid) => {
    const stat = readProcStat(pid);
    return stat !== null && stat.pgrp === pgrp && stat.state !== "Z" && stat.state !== "X" && stat.starttime >= since;
  });
}

function procPids(): number[] {
  try {
    return readdirSync("/proc").filter((n) => /^\d+$/.test(n)).map(Number);
  } catch {
    return [];
  }
}

function descendants(root: number): number[] {
  const pids = procPids();
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
