import type { HomeLayout } from "../../config/paths.ts";
import { UsageError, UserError } from "../../errors.ts";
import { liveLeases } from "../../core/lease.ts";
import { isLocked, tryLock } from "../../core/lock.ts";
import type { EnvPython, EnvRequirementsFile } from "../../ui/env-labels.ts";
import { type EnvMeta, entryPaths, isReady, lastUsedMs, listKeys, readMeta, removeEntryDir } from "./store.ts";

export interface EnvEntry {
  key: string;
  path: string;
  state: "ready" | "building" | "incomplete";
  sizeBytes: number;
  created: string | null;
  lastUsed: string | null;
  summary: string;
  /** The interpreter it was built for (null when its record is not there yet: building, or remains). */
  python: EnvPython | null;
  /** The requirements file it was asked with (REQ_FILE, -r), when one: where, and what it said by digest. */
  requirementsFile: EnvRequirementsFile | null;
  meta: EnvMeta | null;
}

function pythonOf(meta: EnvMeta | null): EnvPython | null {
  if (!meta?.request?.interpreter) return null;
  // The path it was asked by (a venv's python, a shim), else the real binary (envs recorded before inputs were).
  return { version: meta.request.interpreter.version, path: meta.inputs?.interpreter.path ?? meta.request.interpreter.executable };
}

function requirementsFileOf(meta: EnvMeta | null): EnvRequirementsFile | null {
  const file = meta?.inputs?.files.find((f) => f.via === "REQ_FILE");
  return file ? { path: file.path, digest: file.digest } : null;
}

export async function listEnvs(layout: HomeLayout): Promise<EnvEntry[]> {
  const entries: EnvEntry[] = [];
  for (const key of listKeys(layout)) {
    const paths = entryPaths(layout, key);
    const meta = readMeta(paths);
    const ready = isReady(paths);
    const state = ready ? "ready" : (await isLocked(paths.lock)) ? "building" : "incomplete";
    const used = lastUsedMs(paths);
    entries.push({
      key,
      path: paths.dir,
      state,
      sizeBytes: meta?.sizeBytes ?? 0,
      created: meta?.created ?? null,
      lastUsed: used ? new Date(used).toISOString() : null,
      summary: meta?.summary ?? "",
      python: pythonOf(meta),
      requirementsFile: requirementsFileOf(meta),
      meta: ready ? meta : null,
    });
  }
  return entries.sort((a, b) => (b.lastUsed ?? "").localeCompare(a.lastUsed ?? ""));
}

/**
 * The one of `keys` a key prefix names, on this machine or a fleet: null when
 * none (the caller says where it looked); not hex, or more than one: UsageError.
 */
export function keyByPrefix(keyPrefix: string, keys: Iterable<string>): string | null {
  if (!/^[0-9a-f]{1,64}$/i.test(keyPrefix)) throw new UsageError(`not an environment key: ${keyPrefix}`);
  const matches = [...new Set(keys)].filter((k) => k.startsWith(keyPrefix.toLowerCase()));
  if (matches.length > 1) throw new UsageError(`key prefix ${keyPrefix} matches several environments (${matches.map((k) => k.slice(0, 12)).join(", ")}); give more of it`);
  return matches[0] ?? null;
}

export function findEnv(layout: HomeLayout, keyPrefix: string): string {
  const key = keyByPrefix(keyPrefix, listKeys(layout));
  if (!key) throw new UserError(`no environment with key ${keyPrefix} (see gpulayer env list)`);
  return key;
}

/** Remove one environment, refusing while a build holds it or a job leases it (unless forced past the lease). */
export async function removeEnv(layout: HomeLayout, key: string, opts: { force?: boolean } = {}): Promise<void> {
  const paths = entryPaths(layout, key);
  const release = await tryLock(paths.lock);
  if (!release) throw new UserError(`environment ${key.slice(0, 12)} is being built right now; try again when the build ends`);
  try {
    const holders = liveLeases(layout, "env", key);
    if (holders.length && !opts.force) throw new UserError(`environment ${key.slice(0, 12)} is in use by ${holders.join(", ")}; use --force to remove it anyway`);
    removeEntryDir(layout, paths.dir);
  } finally {
    await release();
  }
}
