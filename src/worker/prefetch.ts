import type { WorkerPrefetch } from "../cluster/protocol.ts";
import { conditionsDiffer, entryConditions, hostConditions, prefetchEnv } from "../env/index.ts";
import { type ArtifactView, download, type ShippingSettings } from "./env-shipping.ts";

/**
 * A new worker warm before its first job (worker.prefetch_envs): once
 * registered, it asks the server for the fleet's most used env artifacts it
 * may unpack (its default Python's conditions, at its own env paths) and
 * fetches up to N of them, one at a time, through the checked fetch path
 * (digest, unpack, meta), each under its entry's lock: a job that needs one
 * meanwhile waits for it and reuses it. It runs beside the poll for work,
 * never before it. Off where sharing envs is off (here or on the server) and
 * for a worker without a usable default Python; an offline worker prefetches
 * too (fetching is how it gets envs at all). A failure is reported, never
 * fatal: the job that needs the env fetches or builds it as before.
 */

export interface PrefetchSettings {
  /** worker.prefetch_envs */
  count: number;
  /** The worker's default Python (its probe's path), or null when it has none. */
  python: string | null;
  env: NodeJS.ProcessEnv;
  cwd: string;
}

type Popular = { share: boolean; artifacts: (ArtifactView & { key: string; uses: number })[] };

/** The state as it goes (`report` is called on each change); ends with "done", "off" or "failed". */
export async function prefetchEnvs(s: ShippingSettings, p: PrefetchSettings, report: (state: WorkerPrefetch) => void, signal?: AbortSignal): Promise<WorkerPrefetch> {
  const state: WorkerPrefetch = { state: "prefetching", wanted: p.count, planned: 0, fetched: 0, present: 0, bytes: 0, keys: [] };
  const end = (last: Partial<WorkerPrefetch>) => (Object.assign(state, last), report({ ...state }), state);
  if (!s.share) return end({ state: "off", reason: "sharing envs is off here (worker.share_envs)" });
  if (!p.python) return end({ state: "off", reason: "this worker has no usable default Python" });
  report({ ...state });
  try {
    const host = hostConditions(s.layout, p.python, p.env, p.cwd);
    const q = new URLSearchParams({ limit: String(p.count), envs: host.envs, platform: host.platform, interpreter: host.interpreter, python: host.python, base: host.base });
    const list = await s.client.json<Popular>("GET", `/v1/artifacts/popular?${q}`, undefined, { signal });
    if (!list.share) return end({ state: "off", reason: "the server does not share envs (coordinator.share_envs)" });
    state.planned = list.artifacts.length;
    report({ ...state });
    for (const a of list.artifacts) {
      signal?.throwIfAborted();
      const conditions = entryConditions(s.layout, a.key, host);
      // The server chose it for these conditions; checked here too, as any fetch is.
      if (conditionsDiffer(a.conditions, conditions)) continue;
      const got = await prefetchEnv(s.layout, a.key, (into) => download(s, a, { key: a.key, conditions, into, ...(signal ? { signal } : {}) }), signal);
      if (got.status === "fetched") {
        state.fetched++;
        state.bytes += got.fetched.bytes;
        s.log(`prefetched env ${a.key.slice(0, 12)} from ${a.built_by} (${a.uses} job(s) used it lately; ${(got.fetched.bytes / 1024 ** 2).toFixed(1)} MiB)`);
      } else state.present++;
      state.keys.push(a.key);
      report({ ...state });
    }
    return end({ state: "done" });
  } catch (error) {
    return end({ state: "failed", reason: (error as Error).message.slice(0, 2000) });
  }
}
