import { rmSync } from "node:fs";
import type { HomeLayout } from "../../config/paths.ts";
import { baseFingerprint, runningInterpreter } from "../request/interpreter.ts";
import { acquireEntry } from "./cache-entry.ts";
import { type ArtifactConditions, type FetchedEnv, fetchFolder, installFetched } from "./shipping.ts";
import { entryPaths, isReady } from "./store.ts";

/**
 * A worker warming its cache before its first job (worker.prefetch_envs):
 * the conditions an env built here for its default Python would have, and
 * one env fetched into its entry under the entry's lock, as a prepare does,
 * so a job needing the same env at that moment waits for it and reuses it
 * rather than fetching or building it a second time.
 */

/** What an artifact must match to be unpacked here for `python` (env/store/shipping.ts artifactConditions), but its path: `envs`, the folder every entry's path is in. */
export interface HostConditions extends Omit<ArtifactConditions, "env_path"> {
  envs: string;
}

export function hostConditions(layout: HomeLayout, python: string, env: NodeJS.ProcessEnv, cwd: string): HostConditions {
  const { info } = runningInterpreter(python, env, cwd, layout.interpreters);
  return { envs: layout.envs, platform: info.platform, interpreter: info.realExecutable, python: info.version, base: baseFingerprint(info.siteDirs) };
}

export function entryConditions(layout: HomeLayout, key: string, host: HostConditions): ArtifactConditions {
  const { envs: _, ...rest } = host;
  return { env_path: entryPaths(layout, key).dir, ...rest };
}

/**
 * `key` fetched (`fetch` unpacks the artifact into the folder it is given) and made ready here; "present" when it was
 * ready already, or became ready while this waited for the lock (a job built or fetched it meanwhile).
 */
export async function prefetchEnv(layout: HomeLayout, key: string, fetch: (into: string) => Promise<FetchedEnv>, signal?: AbortSignal): Promise<{ status: "present" } | { status: "fetched"; fetched: FetchedEnv }> {
  const paths = entryPaths(layout, key);
  const { entry } = await acquireEntry<{ status: "present" } | { status: "fetched"; fetched: FetchedEnv }>({
    lock: paths.lock,
    reuse: () => (isReady(paths) ? { status: "present" } : null),
    build: async () => {
      const into = fetchFolder(layout, key);
      try {
        const fetched = await fetch(into);
        installFetched(layout, key, paths, into, fetched);
        return { status: "fetched", fetched };
      } finally {
        rmSync(into, { recursive: true, force: true });
      }
    },
    signal,
  });
  return entry;
}
