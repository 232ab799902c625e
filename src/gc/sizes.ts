import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";

function mtimeMs(path: string): number {
  try {
    return statSync(path).mtimeMs;
  } catch {
    return 0;
  }
}

/**
 * Has an environment changed since its size was measured? Cheap (a few stats,
 * no walk): the entry's own folder, and each lib/<python>/site-packages, the
 * folder every install or uninstall into the env changes. Sizes are measured
 * again only when this says so (or with --refresh-sizes), so gc over
 * thousands of entries does not walk every file every time.
 */
export function changedSince(dir: string, sinceMs: number): boolean {
  if (mtimeMs(dir) > sinceMs) return true;
  let pythons: string[];
  try {
    pythons = readdirSync(join(dir, "lib"));
  } catch {
    return false;
  }
  for (const py of pythons) if (mtimeMs(join(dir, "lib", py, "site-packages")) > sinceMs) return true;
  return false;
}
