import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { contentHash } from "../core/hashing.ts";
import { namesOfDeadOwners } from "../core/dead-owners.ts";
import { FOREIGN_STALE_MS } from "../core/lock.ts";
import { diskUsage } from "../env/index-light.ts";
import type { GcEntry, GcSource } from "./types.ts";
import { removeIntoTrash } from "./trash.ts";

/**
 * The wheelhouse (env/build/wheelhouse.ts): `<sdist digest>/<conditions>/<entry>/`,
 * each entry a wheel, its entry.json and `last-used` (touched when a build
 * takes it). An entry is removed by one rename into the trash; a build that
 * takes a wheel copies it out first and compiles when the copy fails, so a
 * removal under it costs a compile, never a broken env. Folders left half
 * written (`.tmp`) by a build that died are incomplete.
 */
export function wheelSource(layout: HomeLayout): GcSource {
  return { kind: "wheel", list: async () => listWheelEntries(layout) };
}

const dirs = (path: string): string[] => {
  try {
    return readdirSync(path, { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name);
  } catch {
    return [];
  }
};

const statMs = (path: string): number | null => statSync(path, { throwIfNoEntry: false })?.mtimeMs ?? null;

function listWheelEntries(layout: HomeLayout): GcEntry[] {
  const entries: GcEntry[] = [];
  for (const sdist of dirs(layout.wheelhouse)) {
    for (const conditions of dirs(join(layout.wheelhouse, sdist))) {
      // A build writes `<name>.<pid>.tmp` in a moment: one whose process is gone, and quiet for FOREIGN_STALE_MS, died
      // half-way. The wait is for a home shared by nodes, where a pid not running here may be a live build on another.
      const here = join(layout.wheelhouse, sdist, conditions);
      const abandoned = new Set(namesOfDeadOwners(here, /\.(\d+)\.tmp$/).filter((n) => Date.now() - (statMs(join(here, n)) ?? 0) > FOREIGN_STALE_MS));
      for (const name of dirs(join(layout.wheelhouse, sdist, conditions))) {
        const dir = join(layout.wheelhouse, sdist, conditions, name);
        const createdMs = statMs(dir);
        if (createdMs === null) continue; // removed under us
        let wheel = "(unreadable entry)";
        let against: string[] = [];
        try {
          const entry = JSON.parse(readFileSync(join(dir, "entry.json"), "utf8")) as { wheel: string; inputs: { imported: string[] } };
          wheel = entry.wheel;
          against = entry.inputs.imported;
        } catch {
          // half written: incomplete below
        }
        const incomplete = abandoned.has(name);
        if (name.endsWith(".tmp") && !incomplete) continue;
        entries.push({
          kind: "wheel",
          id: contentHash(`${sdist}/${conditions}/${name}`),
          state: incomplete ? "incomplete" : "ready",
          sizeBytes: diskUsage(dir),
          lastUsedMs: statMs(join(dir, "last-used")) ?? createdMs,
          createdMs,
          summary: `wheel ${wheel}${against.length ? ` built against ${against.join(", ")}` : ""}`,
          names: [wheel],
          inUse: async () => [],
          remove: async () => removeIntoTrash(layout, dir, "wheel"),
        });
      }
    }
  }
  return entries;
}
