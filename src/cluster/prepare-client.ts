import { existsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { UsageError } from "../errors.ts";
import { isUrl, refuseStaleLocks, requirementsFileNotFound } from "../env/index-light.ts";
import type { PackProgress, PackResult } from "./bundle.ts";
import { connect, type RemoteTarget } from "./client.ts";
import type { PrepareGroupView, PrepareRequestPayload, PrepareTaskResult } from "./protocol.ts";
import { carriedFiles, type CarryContext } from "./bundle-carry.ts";
import { packTemp, postWithBundle, wireEnvironment } from "./upload.ts";

/**
 * `env prepare` on a coordinator's workers, from the client's side: a
 * prepare task on every matching worker, then each one's result as it ends.
 * Nothing here prints.
 */

export interface PrepareGroup {
  id: string;
  workers: string[];
}

export interface StartPrepareOptions {
  labels: Record<string, string>;
  /** Where the request's relative paths start. */
  cwd: string;
  /** The folder that must travel (the requirements file's) is being uploaded: the server lacked it. */
  onUpload?(pack: PackResult, root: string): void;
  /** Packing it, as for a job: progress on a big folder, and what is left out. */
  onPacking?(p: PackProgress): void;
  onSkipped?(s: { path: string; reason: string }): void;
  onOwnerOnly?(paths: string[]): void;
  /** How the client reads the request to find the local projects whose installed files travel whatever .gitignore says. */
  reading: Omit<CarryContext, "cwd">;
}

/**
 * Check the request, pack what must travel (the requirements file's folder,
 * or a uv project's), and start a prepare task on every worker the labels
 * pick.
 */
export async function startPrepare(target: RemoteTarget, req: PrepareRequestPayload, opts: StartPrepareOptions): Promise<PrepareGroup> {
  const { cwd } = opts;
  if (req.pull !== undefined && req.image === undefined) throw new UsageError("--pull goes with --image");
  for (const s of req.specs) if (/^(\.{0,2}\/|~)/.test(s.trim())) throw new UsageError(`-p ${s}: a local path cannot travel to the workers; list it in a requirements file inside the folder to send`);
  // Before anything is packed: a file that is not there is said as a local prepare says it.
  if (req.requirementsFile && !existsSync(resolve(cwd, req.requirementsFile))) throw requirementsFileNotFound(req.requirementsFile);
  refuseStaleLocks([req], opts.reading.env, cwd);
  const localLinks = req.findLinks.filter((f) => !isUrl(f));
  // What travels: the requirements file's folder (its includes and local paths are relative to it), or the uv project's (its lock, its files).
  const root = req.requirementsFile ? dirname(resolve(cwd, req.requirementsFile)) : req.project !== undefined ? resolve(cwd, req.project) : cwd;
  const pack = req.requirementsFile || req.project !== undefined || localLinks.length ? packTemp(root, target.bundleLimits, opts.onPacking, carriedFiles(root, [req], { ...opts.reading, cwd })) : null;
  try {
    for (const s of pack?.skipped ?? []) opts.onSkipped?.(s);
    if (pack?.ownerOnly.length) opts.onOwnerOnly?.(pack.ownerOnly);
    const { pull, ...asked } = req;
    const request: PrepareRequestPayload = { ...wireEnvironment(asked, root, cwd, pack ?? undefined), ...(pull ? { pull } : {}) };
    return await postWithBundle<PrepareGroup>(connect(target), "/v1/prepares", { request, bundle: pack?.hash ?? null, labels: opts.labels }, pack, {
      onUpload: (p) => opts.onUpload?.(p, root),
    });
  } finally {
    pack?.dispose();
  }
}

/** One worker's result, as `env prepare --json` lists it (seconds to 4 places; a task without a result failed). */
export type WorkerPrepareResult = { worker: string } & PrepareTaskResult;

/** A worker's task ended (result null: it ended without one); then, once all have, every worker's result. */
export type PrepareUpdate =
  | { kind: "step"; worker: string; type: string; data: Record<string, unknown> }
  | { kind: "finished"; worker: string; result: PrepareTaskResult | null }
  | { kind: "done"; workers: WorkerPrepareResult[] };

/** Follow a prepare group (long polls) until every task has ended: each worker's build steps as they come, then its result. */
export async function* followPrepare(target: RemoteTarget, groupId: string): AsyncGenerator<PrepareUpdate, void> {
  const client = connect(target);
  const shown = new Set<string>();
  let after = 0;
  for (;;) {
    const view = await client.json<PrepareGroupView>("GET", `/v1/prepares/${groupId}?known=${shown.size}&after=${after}&wait=20`);
    for (const s of view.steps ?? []) {
      after = Math.max(after, s.seq);
      yield { kind: "step", worker: s.worker, type: s.type, data: s.data };
    }
    for (const t of view.tasks) {
      if (t.state === "assigned" || t.state === "running" || shown.has(t.id)) continue;
      shown.add(t.id);
      yield { kind: "finished", worker: t.worker, result: t.result };
    }
    if (view.done) {
      const workers = view.tasks.map((t) => ({ worker: t.worker, ...(t.result ?? { status: "failed" as const, seconds: 0, message: "no result" }), seconds: Number((t.result?.seconds ?? 0).toFixed(4)) }));
      yield { kind: "done", workers };
      return;
    }
  }
}
