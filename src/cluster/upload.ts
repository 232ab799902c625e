import { existsSync, readFileSync, rmSync } from "node:fs";
import { namesOfDeadOwners } from "../core/dead-owners.ts";
import { tmpdir } from "node:os";
import { isAbsolute, join, relative, resolve, sep } from "node:path";
import { type BundleLimits, type Carried, type PackProgress, type PackResult, packWorkdir } from "./bundle.ts";
import type { ClusterClient } from "./client.ts";
import { HttpError, UsageError } from "../errors.ts";
import { type EnvironmentRequest, isUrl, lockLocalSources } from "../env/index-light.ts";
import type { WireEnvironment } from "../env/index-light.ts";

/** A folder packed into a temporary bundle; remove it with `dispose`. */
export function packTemp(root: string, limits: BundleLimits, onProgress?: (p: PackProgress) => void, carried?: Carried): PackResult & { dispose(): void } {
  removeDeadPacks(tmpdir());
  const file = join(tmpdir(), `gpulayer-bundle-${process.pid}-${Date.now()}-${Math.random().toString(16).slice(2)}.tar.gz`);
  try {
    return { ...packWorkdir(root, file, limits, onProgress, carried), dispose: () => rmSync(file, { force: true }) };
  } catch (error) {
    rmSync(file, { force: true });
    throw error;
  }
}

/** What a client killed mid-way (SIGKILL) left of its bundle: removed by the next one, once that process is gone. */
function removeDeadPacks(dir: string): void {
  for (const name of namesOfDeadOwners(dir, /^gpulayer-bundle-(\d+)-\d+-[0-9a-f]+\.tar\.gz$/)) rmSync(join(dir, name), { force: true });
}

/** A client path as the worker will see it: relative to the bundle's root, which it must be inside and part of. */
export function inBundle(root: string, abs: string, what: string, pack?: PackResult): string {
  const rel = relative(root, abs);
  if (rel.startsWith("..") || isAbsolute(rel)) throw new UsageError(`${what} ${abs} is outside ${root}: with a server, what the job reads travels in the bundle of that folder; move it inside`);
  const posix = rel.split(sep).join("/") || ".";
  if (pack && posix !== "." && !pack.entries.includes(posix)) throw new UsageError(`${what} ${posix} is left out of the bundle (by .gitignore, .gpulayerignore or the default excludes); the worker would not find it`);
  return posix;
}

/**
 * A request as it travels to a worker (a job's, `env prepare --server`'s): its files made relative to the bundle's
 * root (and checked to be in it), relative ones read from `cwd`; where `python` was named and the local confinement
 * stay here. The one way onto the wire: a worker reads the same fields back (env/request/request-schema.ts).
 */
export function wireEnvironment(e: EnvironmentRequest, root: string, cwd: string, pack?: PackResult): WireEnvironment {
  return {
    ...(e.requirementsFile ? { requirementsFile: inBundle(root, resolve(cwd, e.requirementsFile), "the requirements file", pack) } : {}),
    specs: e.specs,
    ...(e.specsOrigin && e.specs.length ? { specsOrigin: e.specsOrigin } : {}),
    ...(e.python ? { python: e.python } : {}),
    ...(e.conda ? { conda: e.conda } : {}),
    ...(e.indexUrl ? { indexUrl: e.indexUrl } : {}),
    extraIndexUrls: e.extraIndexUrls,
    findLinks: e.findLinks.map((f) => (isUrl(f) ? f : inBundle(root, resolve(cwd, f), "--find-links", pack))),
    ...(e.image ? { image: e.image } : {}),
    // A uv project travels with its lock: both must be in the bundle (the worker syncs from them).
    ...(e.project ? { project: projectInBundle(root, resolve(cwd, e.project), pack), groups: e.groups ?? [], extras: e.extras ?? [] } : {}),
    ...(e.noBuildIsolation?.length ? { noBuildIsolation: e.noBuildIsolation } : {}),
    ...(e.prepareTimeoutMs ? { prepareTimeoutMs: e.prepareTimeoutMs } : {}),
  };
}

/** A uv project's folder relative to the bundle's root, its pyproject.toml and uv.lock checked to travel with it. */
function projectInBundle(root: string, dir: string, pack?: PackResult): string {
  for (const f of ["pyproject.toml", "uv.lock"]) if (existsSync(join(dir, f))) inBundle(root, join(dir, f), `the project's ${f}`, pack);
  // Its lock's local packages travel too, or the worker finds none of them (said here, in the user's paths).
  for (const local of lockLocalSources(dir)) inBundle(root, local, "the lock's local package", pack);
  return inBundle(root, dir, "the project", pack);
}

export interface UploadHooks {
  onUpload?(pack: PackResult): void;
  onAlreadyThere?(pack: PackResult): void;
}

/**
 * POST a submission that names a bundle. The server answers 409
 * bundle_missing when it lacks it (never had it, or removed it since, unused):
 * only then is it uploaded (once per content), and the submission sent again.
 * A refusal (422) comes before any upload.
 */
export async function postWithBundle<T>(client: ClusterClient, path: string, body: Record<string, unknown>, pack: PackResult | null, hooks: UploadHooks = {}): Promise<T> {
  const missing = (error: unknown) => pack && error instanceof HttpError && error.status === 409 && error.body.error === "bundle_missing";
  try {
    const r = await client.json<T>("POST", path, body);
    if (pack) hooks.onAlreadyThere?.(pack);
    return r;
  } catch (error) {
    if (!missing(error)) throw error;
  }
  hooks.onUpload?.(pack!);
  const data = readFileSync(pack!.file);
  // The server's cleanup can run between the upload and the submission (with GPULAYER_BUNDLE_RETENTION=0): once more then.
  for (let attempt = 1; ; attempt++) {
    await client.request("PUT", `/v1/bundles/${pack!.hash}`, data);
    try {
      return await client.json<T>("POST", path, body);
    } catch (error) {
      if (!missing(error) || attempt >= 2) throw error;
    }
  }
}
