import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { diskUsage } from "../env/index-light.ts";
import type { GcEntry, GcSource } from "./types.ts";
import { removeIntoTrash } from "./trash.ts";

/**
 * The bytecode store (env/build/bytecode.ts): `<interpreter digest>/`, one
 * bucket per interpreter (its `interpreter` file names it), each one entry,
 * with `last-used` touched by the compiles that use it (at most hourly). A
 * bucket is removed by one rename into the trash: the store is best effort,
 * so a compile that finds its entry gone compiles the module, and one that
 * links into a removed bucket links into the trash. No lease: removing it
 * costs compiles, never an env (its files are also the envs' own .pyc files,
 * which keep their other names).
 */
export function bytecodeSource(layout: HomeLayout): GcSource {
  return { kind: "bytecode", list: async () => listBuckets(layout) };
}

const interpreterOf = (dir: string): string => {
  try {
    return readFileSync(join(dir, "interpreter"), "utf8").trim() || "an interpreter";
  } catch {
    return "an interpreter";
  }
};

const statMs = (path: string): number | null => statSync(path, { throwIfNoEntry: false })?.mtimeMs ?? null;

function listBuckets(layout: HomeLayout): GcEntry[] {
  let names: string[];
  try {
    names = readdirSync(layout.bytecode, { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name);
  } catch {
    return [];
  }
  const entries: GcEntry[] = [];
  for (const name of names.sort()) {
    const dir = join(layout.bytecode, name);
    const createdMs = statMs(dir);
    if (createdMs === null) continue; // removed under us
    entries.push({
      kind: "bytecode",
      id: name,
      state: "ready",
      sizeBytes: diskUsage(dir),
      lastUsedMs: statMs(join(dir, "last-used")) ?? createdMs,
      createdMs,
      summary: `modules compiled by ${interpreterOf(dir)}`,
      inUse: async () => [],
      remove: async () => removeIntoTrash(layout, dir, "bytecode"),
    });
  }
  return entries;
}
