import { createWriteStream } from "node:fs";
import type { ClusterClient } from "../cluster/client.ts";
import type { HomeLayout } from "../config/paths.ts";

/** What a worker ships envs (env-shipping.ts) and wheels (wheel-shipping.ts) with. */
export interface ShippingSettings {
  layout: HomeLayout;
  client: ClusterClient;
  /** worker.offline */
  offline: boolean;
  /** worker.share_envs */
  share: boolean;
  log(message: string): void;
  /** Uploads still running (awaited when the worker stops). */
  uploads: Set<Promise<void>>;
}

/** How often a build claim (an env's, a wheel's) is renewed while its build runs and uploads: well inside the server's 60 s (server/build-claims.ts). */
export const RENEW_MS = 20_000;

/** What was downloaded is not what its sha256 names (the server's copy is damaged, or it lies). */
export class DigestMismatch extends Error {}

/**
 * GET `path` into `file`, its sha256 checked against `sha` as the bytes come (written with back-pressure, never held
 * whole); the bytes received. A mismatch throws, leaving the file to the caller.
 */
export async function downloadChecked(client: ClusterClient, path: string, file: string, sha: string, signal?: AbortSignal): Promise<number> {
  const res = await client.request("GET", path, undefined, { signal });
  const hasher = new Bun.CryptoHasher("sha256");
  const out = createWriteStream(file, { mode: 0o600 });
  let bytes = 0;
  try {
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      hasher.update(chunk);
      bytes += chunk.length;
      if (!out.write(chunk)) await new Promise((r) => out.once("drain", r));
    }
  } finally {
    await new Promise<void>((resolve, reject) => out.end((e?: Error | null) => (e ? reject(e) : resolve())));
  }
  const got = hasher.digest("hex");
  if (got !== sha) throw new DigestMismatch(`its content does not match its sha256 (got ${got.slice(0, 12)}, ${bytes} bytes)`);
  return bytes;
}

/**
 * GET `path` and hand its bytes to `consume` as they come (an unpacker), their sha256 checked against `sha` as they
 * pass; the bytes received. The digest decides: a mismatch, known only at the end, throws DigestMismatch even where
 * `consume` failed first on the damaged bytes (what it wrote is the caller's to remove), so the reason is the same
 * whatever the damage.
 */
export async function streamChecked(client: ClusterClient, path: string, sha: string, consume: (chunks: AsyncIterable<Uint8Array>) => Promise<void>, signal?: AbortSignal): Promise<number> {
  const res = await client.request("GET", path, undefined, { signal });
  const hasher = new Bun.CryptoHasher("sha256");
  const body = (res.body as unknown as AsyncIterable<Uint8Array>)[Symbol.asyncIterator]();
  let bytes = 0;
  /** The body itself broke (the network, an abort): that is the reason, not the digest. */
  let broken: { error: unknown } | null = null;
  const next = async (): Promise<Uint8Array | null> => {
    if (broken) throw broken.error;
    const r = await body.next().catch((error: unknown) => {
      broken = { error };
      throw error;
    });
    if (r.done) return null;
    hasher.update(r.value);
    bytes += r.value.length;
    return r.value;
  };
  // Pulls the body without owning it: a consumer that stops early leaves the rest to be hashed below.
  const chunks = async function* () {
    for (let c = await next(); c; c = await next()) yield c;
  };
  let failure: { error: unknown } | null = null;
  await consume(chunks()).catch((error: unknown) => (failure = { error }));
  signal?.throwIfAborted();
  while (await next());
  const got = hasher.digest("hex");
  if (got !== sha) throw new DigestMismatch(`its content does not match its sha256 (got ${got.slice(0, 12)}, ${bytes} bytes)`);
  if (failure) throw (failure as { error: unknown }).error;
  return bytes;
}

/** PUT an upload; null when the server has one of the same already (409: another worker's, which is fine). */
export async function putShared(client: ClusterClient, path: string, body: Blob, headers: Record<string, string>): Promise<Response | null> {
  return client.request("PUT", path, body, { headers }).catch((error) => {
    if ((error as { status?: number }).status === 409) return null;
    throw error;
  });
}
