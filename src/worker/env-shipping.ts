import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { sleep } from "../core/sleep.ts";
import { InstallError } from "../errors.ts";
import { packEnv, unpackedMetaMismatch, unpackEnvStream } from "../env/index.ts";
import { type ArtifactConditions, type BuildTicket, conditionsDiffer, type FetchedEnv, type Shipping, type ShippingRequest } from "../env/index.ts";
import { entryPaths } from "../env/index.ts";
import { putShared, streamChecked, RENEW_MS, type ShippingSettings } from "./shipping-transfer.ts";
import { wheelSharing } from "./wheel-shipping.ts";

/**
 * A joined worker's side of env artifacts (env/store/shipping.ts): before a build,
 * ask the server for an artifact of the key whose conditions match here;
 * none, and another worker is building it for the same path: wait for its
 * artifact; none being built: claim the build for this task, build, then
 * pack and upload in the background (the job goes on), holding the claim
 * until the upload ends. An offline worker builds only an env with builds
 * without isolation, with no index, from the fleet's wheels. Every failure to
 * fetch falls back to a build, its reason in the build's steps; an artifact
 * refused is reported, and when the server drops it (it checks it too) this
 * build's artifact takes its place.
 */

export type { ShippingSettings };

export interface ArtifactView {
  sha256: string;
  bytes: number;
  built_by: string;
  conditions: ArtifactConditions;
}

interface Listing {
  share: boolean;
  artifacts: ArtifactView[];
  building: string | null;
  builders: string[];
}

/** How long a wait for another worker's build looks again. */
const POLL_MS = 1000;

export function workerShipping(s: ShippingSettings, taskId: string): Shipping | undefined {
  if (!s.share && !s.offline) return undefined;
  const wheels = wheelSharing(s, taskId);
  return {
    acquire: (req) => acquire(s, taskId, req),
    ...(wheels ? { wheels } : {}),
  };
}

/** The server could not be asked (an outage, an older server): a worker with an index builds; an offline one cannot. */
async function acquire(s: ShippingSettings, taskId: string, req: ShippingRequest): Promise<{ fetched: FetchedEnv } | { build: BuildTicket }> {
  try {
    return await fromServer(s, taskId, req);
  } catch (error) {
    if (req.signal?.aborted || error instanceof InstallError) throw error;
    const why = (error as Error).message;
    if (s.offline) throw new InstallError(`this worker is offline (worker.offline) and builds no env, and the server could not be asked for an artifact of env ${req.key.slice(0, 12)}: ${why}`, "");
    req.onStep?.("building", `here: the server could not be asked for an artifact (${why})`);
    return { build: noTicket() };
  }
}

async function fromServer(s: ShippingSettings, taskId: string, req: ShippingRequest): Promise<{ fetched: FetchedEnv } | { build: BuildTicket }> {
  const q = `key=${req.key}&path=${encodeURIComponent(req.conditions.env_path)}`;
  /** The worker whose build this one waited for (said once). */
  let waitedFor: string | null = null;
  let reported = false;
  /** The server dropped what was refused here, and that line said this worker builds. */
  let dropped = false;
  /** Artifacts that failed here (not those for elsewhere), by sha: reported to the server once. */
  const refused = new Map<string, string>();
  for (;;) {
    req.signal?.throwIfAborted();
    const list = await s.client.json<Listing>("GET", `/v1/artifacts?${q}`, undefined, { signal: req.signal });
    const sharing = list.share && s.share;
    const refusals: string[] = [];
    for (const a of sharing ? list.artifacts : []) {
      const differs = conditionsDiffer(a.conditions, req.conditions);
      if (differs) {
        refusals.push(`${a.sha256.slice(0, 12)} from ${a.built_by}: ${differs}`);
        continue;
      }
      try {
        return { fetched: await download(s, a, req) };
      } catch (error) {
        if (req.signal?.aborted) throw error;
        refusals.push(`${a.sha256.slice(0, 12)} from ${a.built_by}: ${(error as Error).message}`);
        refused.set(a.sha256, (error as Error).message);
        req.onStep?.("refused", `artifact ${a.sha256.slice(0, 12)} from ${a.built_by}: ${(error as Error).message}`);
      }
    }
    if (s.offline && sharing && req.deferred?.length && !refused.size) {
      // What such an env needs beyond what the worker has is mostly compiled: the fleet's wheels, with no index for the rest.
      req.onStep?.("building", `here, with no index (worker.offline): ${refusals.length ? `no artifact fits (${refusals.join("; ")})` : `no worker of the fleet has built env ${req.key.slice(0, 12)} yet`}; ${req.deferred.join(", ")} from the fleet's wheels`);
      return { build: { ...noTicket(), offline: true } };
    }
    if (s.offline) {
      const can = list.builders;
      const why = !sharing ? "sharing envs is off" : refusals.length ? `none fits here (${refusals.join("; ")})` : "no worker has built it yet";
      throw new InstallError(`this worker is offline (worker.offline) and builds no env; no artifact of env ${req.key.slice(0, 12)} to fetch: ${why}${can.length ? `; a worker with a package index can build it: ${can.join(", ")}` : "; no worker with a package index is joined"}`, "");
    }
    if (!sharing) return { build: noTicket() };
    if (refused.size) {
      const gone = reported ? [] : await report(s, refused, req);
      reported = true;
      if (gone.length < refused.size) {
        // One artifact per key and path is kept, and the server keeps one refused here: build here, share nothing.
        req.onStep?.("building", `here: ${refusals.join("; ")}`);
        return { build: noTicket() };
      }
      // The server dropped what was refused here: claim the build, and its artifact takes the place.
      req.onStep?.("building", `here: the server dropped artifact ${gone.map((d) => d.slice(0, 12)).join(", ")}, refused here`);
      dropped = true;
      refused.clear();
      continue;
    }
    const claim = await s.client.json<{ granted: boolean; holder?: string }>("POST", "/v1/artifacts/claim", { key: req.key, path: req.conditions.env_path, task: taskId }, { signal: req.signal });
    if (claim.granted) {
      // The builder before us may have uploaded and let go between our listing and our claim: look once more.
      const again = await s.client.json<Listing>("GET", `/v1/artifacts?${q}`, undefined, { signal: req.signal });
      if (!again.artifacts.some((a) => !conditionsDiffer(a.conditions, req.conditions))) {
        // Why this worker builds, once (a drop said it already): no artifact of it, none for here, or the build waited for left none.
        const why = waitedFor ? `${waitedFor} left no artifact of env ${req.key.slice(0, 12)}` : refusals.length ? `no artifact fits (${refusals.join("; ")})` : `no worker of the fleet has built env ${req.key.slice(0, 12)} yet`;
        if (!dropped) req.onStep?.("building", `here: ${why}`);
        return { build: ticket(s, taskId, req) };
      }
      await s.client.json("POST", "/v1/artifacts/claim", { key: req.key, path: req.conditions.env_path, release: true }).catch(() => undefined);
      continue;
    }
    if (!waitedFor) req.onStep?.("waiting", `for ${claim.holder}, which is building env ${req.key.slice(0, 12)} for this same path`);
    waitedFor = claim.holder ?? "another worker";
    await sleep(POLL_MS);
  }
}

/** Tell the server which artifacts failed here and why; the shas it dropped (it drops only what it finds unsound itself). */
async function report(s: ShippingSettings, refused: Map<string, string>, req: ShippingRequest): Promise<string[]> {
  const dropped: string[] = [];
  for (const [sha, reason] of refused) {
    const r = await s.client.json<{ dropped: boolean }>("POST", "/v1/artifacts/report", { sha, reason: reason.slice(0, 2000) }, { signal: req.signal }).catch(() => ({ dropped: false }));
    if (r.dropped) dropped.push(sha);
  }
  return dropped;
}

function noTicket(): BuildTicket {
  return { built() {}, failed() {} };
}

/** The build is ours: renew the claim while it runs and while its artifact uploads (the server takes it only under the claim), then let the claim go. */
function ticket(s: ShippingSettings, taskId: string, req: ShippingRequest): BuildTicket {
  const claimBody = { key: req.key, path: req.conditions.env_path, task: taskId };
  const renew = setInterval(() => void s.client.json("POST", "/v1/artifacts/claim", claimBody).catch(() => undefined), RENEW_MS);
  renew.unref();
  const release = () => s.client.json("POST", "/v1/artifacts/claim", { key: req.key, path: req.conditions.env_path, release: true }).catch(() => undefined);
  return {
    built() {
      const upload = share(s, taskId, req)
        .catch((error) => s.log(`env ${req.key.slice(0, 12)}: not shared (${(error as Error).message})`))
        .finally(() => {
          clearInterval(renew);
          void release();
          s.uploads.delete(upload);
        });
      s.uploads.add(upload);
    },
    failed() {
      clearInterval(renew);
      void release();
    },
  };
}

async function share(s: ShippingSettings, taskId: string, req: ShippingRequest): Promise<void> {
  const paths = entryPaths(s.layout, req.key);
  const dir = s.layout.clusterArtifacts;
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${req.key}.${process.pid}.${crypto.randomUUID()}.tar.zst`);
  try {
    const t = performance.now();
    const packed = await packEnv(paths.dir, file);
    const conditions = Buffer.from(JSON.stringify(req.conditions)).toString("base64");
    // null: another worker's artifact of it is there, which is fine.
    const res = await putShared(s.client, `/v1/artifacts/${packed.sha256}?task=${encodeURIComponent(taskId)}&key=${req.key}`, Bun.file(file), { "x-gpulayer-conditions": conditions });
    if (res) s.log(`env ${req.key.slice(0, 12)}: shared as artifact ${packed.sha256.slice(0, 12)} (${(packed.bytes / 1024 ** 2).toFixed(1)} MiB, ${((performance.now() - t) / 1000).toFixed(1)} s)`);
  } finally {
    rmSync(file, { force: true });
  }
}

/** Download and unpack into `req.into` at once, the digest checked at the end; on any failure `req.into` goes (nothing is published before the caller renames it). */
export async function download(s: ShippingSettings, a: ArtifactView, req: ShippingRequest): Promise<FetchedEnv> {
  const t = performance.now();
  req.onStep?.("fetching", `env ${req.key.slice(0, 12)} from ${a.built_by} (artifact ${a.sha256.slice(0, 12)}, ${(a.bytes / 1024 ** 2).toFixed(1)} MiB)`);
  mkdirSync(req.into, { recursive: true });
  try {
    const bytes = await streamChecked(s.client, `/v1/artifacts/${a.sha256}`, a.sha256, (chunks) => unpackEnvStream(chunks, req.into), req.signal);
    const mismatch = unpackedMetaMismatch(req.into, req.key, req.conditions.env_path);
    if (mismatch) throw new Error(mismatch);
    return { sha256: a.sha256, bytes, seconds: (performance.now() - t) / 1000, builtBy: a.built_by };
  } catch (error) {
    rmSync(req.into, { recursive: true, force: true });
    throw error;
  }
}
