import { mkdirSync, readFileSync } from "node:fs";
import { localIndexFolders } from "./local-index.ts";
import { join } from "node:path";
import { exportLock, type LockedProject, lockRegistries, normalizeName, projectUvEnv, sameVersion } from "../env/index.ts";
import type { ImagePython } from "./image-python.ts";

/**
 * A uv project's lock for an image build: exported on the host by uv (`uv export --locked`: exact pins with their
 * hashes, a stale lock refused in uv's words), installed in the container by the image's Python with --no-deps
 * --require-hashes from the lock's own indexes. The key stays the lock (image-env.ts).
 */

/** Where the exported lock is, inside the build container. */
export const LOCK_MOUNT = "/opt/gpulayer/lock";

/** An image package the lock pins at another version (a local label counts): name (normalised), the image's, the locked. */
export interface Shadowed {
  name: string;
  worker: string;
  locked: string;
}

export interface ImageLock {
  /** The lock's indexes: a URL, or a folder by its absolute path (mounted read-only at that path). */
  registries: string[];
  shadowed: Shadowed[];
  /** `--volume` values: the exported list and the lock's local index folders, read-only. */
  mounts: string[];
}

/** The lock exported into `dir` (a folder of the build's own, gone with it), and what the build container needs of it. */
export async function exportForImage(
  project: LockedProject,
  py: ImagePython,
  dir: string,
  run: { uv: string; env: NodeJS.ProcessEnv; cwd: string; onLine?: (line: string) => void; signal?: AbortSignal },
): Promise<ImageLock> {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const file = join(dir, "requirements.txt");
  const hostEnv = Object.fromEntries(Object.entries(run.env).filter((e): e is [string, string] => e[1] !== undefined));
  await exportLock(project, file, { uv: run.uv, env: projectUvEnv(hostEnv, join(dir, "no-env"), join(dir, "no-config")), cwd: run.cwd, hooks: { onOutput: run.onLine }, signal: run.signal });
  const registries = lockRegistries(project.dir);
  return { registries, shadowed: shadowedInImage(py, readFileSync(file, "utf8")), mounts: [`${dir}:${LOCK_MOUNT}:ro`, ...registries.filter((r) => r.startsWith("/")).flatMap((r) => localIndexFolders(r)).map((r) => `${r}:${r}:ro`)] };
}

/** The image's packages an exported lock (`name==version` lines) pins at another version. */
function shadowedInImage(py: ImagePython, exported: string): Shadowed[] {
  const pins = new Map<string, string>();
  for (const m of exported.matchAll(/^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)/gm)) pins.set(normalizeName(m[1]!), m[2]!);
  const out: Shadowed[] = [];
  for (const dist of py.distributions) {
    const [name, version] = dist.split("==") as [string, string];
    const locked = pins.get(normalizeName(name));
    if (locked !== undefined && !sameVersion(locked, version)) out.push({ name: normalizeName(name), worker: version, locked });
  }
  return out.sort((a, b) => (a.name < b.name ? -1 : 1));
}
