import { connect, isUnavailable, type RemoteTarget } from "./client.ts";
import { HttpError, UserError } from "../errors.ts";
import type { WorkerView } from "./protocol.ts";

/** The coordinator's workers: those connected, or (all) also those that left or were lost. */
export async function listWorkers(target: RemoteTarget, opts: { all?: boolean } = {}): Promise<WorkerView[]> {
  const workers = await connect(target).json<WorkerView[]>("GET", "/v1/workers");
  return opts.all ? workers : workers.filter((w) => w.state !== "left" && w.state !== "lost");
}

/** The env artifacts the coordinator keeps (server/artifacts.ts), with their totals. */
export interface ArtifactsView {
  share: boolean;
  max_bytes: number;
  count: number;
  bytes: number;
  artifacts: { sha256: string; key: string; bytes: number; built_by: string; created: string; last_used: string }[];
  /** Wheels compiled without build isolation the fleet shares (absent from an older server). */
  wheels?: { count: number; bytes: number };
}

export function listArtifacts(target: RemoteTarget): Promise<ArtifactsView> {
  return connect(target).json<ArtifactsView>("GET", "/v1/artifacts");
}

export interface ArtifactTrimView {
  removed: { sha: string; key: string; bytes: number; built_by: string }[];
  skipped: { sha: string; reason: string }[];
  kept_bytes: number;
  kept: number;
  max_bytes: number;
}

/** Trim the coordinator's artifacts, least recently used first, to `maxBytes` (its own limit when not given). */
export function trimArtifacts(target: RemoteTarget, opts: { maxBytes?: number; dryRun: boolean }): Promise<ArtifactTrimView> {
  return connect(target).json<ArtifactTrimView>("POST", "/v1/artifacts/gc", { ...(opts.maxBytes !== undefined ? { max_bytes: opts.maxBytes } : {}), dry_run: opts.dryRun });
}

/**
 * Wait until at least `count` workers are connected, asking again every half
 * second; a server that does not answer yet (just started) is waited for too.
 * A refused token is no reason to wait: it fails at once. Past `timeoutMs`,
 * one line saying what was there.
 */
export async function waitForWorkers(target: RemoteTarget, count: number, timeoutMs: number): Promise<WorkerView[]> {
  const deadline = Date.now() + timeoutMs;
  let last = "";
  for (;;) {
    try {
      const workers = await listWorkers(target);
      if (workers.length >= count) return workers;
      last = `${workers.length} of ${count} worker(s) connected`;
    } catch (error) {
      // A replica that cannot serve yet (502/503/504: its database not there yet) is waited for as one not answering.
      if (error instanceof HttpError && !isUnavailable(error.status)) throw error;
      if (!(error instanceof UserError)) throw error;
      last = error.message;
    }
    if (Date.now() >= deadline) throw new UserError(`gave up waiting for ${count} worker(s) after ${Math.round(timeoutMs / 1000)} s: ${last}`);
    await Bun.sleep(500);
  }
}
