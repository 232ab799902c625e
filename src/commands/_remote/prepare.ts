import { dirname, resolve } from "node:path";
import { ExitError, UsageError } from "../../errors.ts";
import { formatSeconds, type Output, shortKey } from "../../ui/output.ts";
import { ClusterClient, type RemoteTarget } from "../../cluster/client.ts";
import { formatLabels, labelsFromArgs, type PrepareGroupView, type PrepareRequestPayload, type PrepareTaskResult } from "../../cluster/protocol.ts";
import { inBundle, packTemp, postWithBundle } from "../../cluster/upload.ts";
import { isUrl } from "../../env/request.ts";

/**
 * `env prepare` against a server: the command layer of its remote branch. A
 * prepare task on every matching worker, and a line per worker as each one
 * ends: built / reused / failed (with the installer's message), and seconds.
 */

/** The same fields a worker receives (requirements, python, indexes, image, pull). */
export type RemotePrepareRequest = PrepareRequestPayload;

function line(worker: string, r: PrepareTaskResult | null): string {
  if (!r) return `${worker}  failed  -  no result`;
  const what = r.status === "failed" ? r.message?.split("\n").join("\n    ") : r.image ? `${r.image} ${r.digest ?? ""}`.trim() : `env ${shortKey(r.key ?? "")} ${r.path ?? ""}`.trim();
  return `${worker}  ${r.status}  ${formatSeconds(r.seconds)}  ${what}`;
}

export async function prepareRemote(target: RemoteTarget, req: RemotePrepareRequest, rawArgs: string[], out: Output, cwd = process.cwd()): Promise<void> {
  const labels = labelsFromArgs(rawArgs);
  if (req.pull !== undefined && req.image === undefined) throw new UsageError("--pull goes with --image");
  if (req.image && (req.requirementsFile || req.specs.length)) throw new UsageError("env prepare: --image and requirements do not go together (an image brings its own environment)");
  const client = new ClusterClient(target.url, target.token);
  for (const s of req.specs) if (/^(\.{0,2}\/|~)/.test(s.trim())) throw new UsageError(`-p ${s}: a local path cannot travel to the workers; list it in a requirements file inside the folder to send`);
  // What must travel: the requirements file's folder (its includes and local paths are relative to it).
  const localLinks = req.findLinks.filter((f) => !isUrl(f));
  const root = req.requirementsFile ? dirname(resolve(cwd, req.requirementsFile)) : cwd;
  const pack = req.requirementsFile || localLinks.length ? packTemp(root, target.bundleLimits) : null;
  let group: { id: string; workers: string[] };
  try {
    const request: PrepareRequestPayload = {
      ...(req.requirementsFile ? { requirementsFile: inBundle(root, resolve(cwd, req.requirementsFile), "the requirements file", pack ?? undefined) } : {}),
      specs: req.specs,
      ...(req.python ? { python: req.python } : {}),
      ...(req.indexUrl ? { indexUrl: req.indexUrl } : {}),
      extraIndexUrls: req.extraIndexUrls,
      findLinks: req.findLinks.map((f) => (isUrl(f) ? f : inBundle(root, resolve(cwd, f), "--find-links", pack ?? undefined))),
      ...(req.image ? { image: req.image } : {}),
      ...(req.pull ? { pull: req.pull } : {}),
    };
    group = await postWithBundle(client, "/v1/prepares", { request, bundle: pack?.hash ?? null, labels }, pack, {
      onUpload: (p) => out.progress(`uploading ${root} (${p.files} entries) for the workers`),
    });
  } finally {
    pack?.dispose();
  }
  out.progress(`preparing on ${group.workers.length} worker(s) of ${target.url}${Object.keys(labels).length ? ` [${formatLabels(labels)}]` : ""}: ${group.workers.join(", ")}`);
  const shown = new Set<string>();
  let view: PrepareGroupView;
  for (;;) {
    view = await client.json<PrepareGroupView>("GET", `/v1/prepares/${group.id}?known=${shown.size}&wait=20`);
    for (const t of view.tasks) {
      if (t.state === "assigned" || t.state === "running" || shown.has(t.id)) continue;
      shown.add(t.id);
      if (!out.json) process.stdout.write(`${line(t.worker, t.result)}\n`);
    }
    if (view.done) break;
  }
  const workers = view.tasks.map((t) => ({ worker: t.worker, ...(t.result ?? { status: "failed", seconds: 0, message: "no result" }), seconds: Number((t.result?.seconds ?? 0).toFixed(4)) }));
  if (out.json) out.result({ server: target.url, workers }, () => "");
  const failed = workers.filter((w) => w.status === "failed");
  if (failed.length) {
    out.log.error(`failed on ${failed.length} of ${workers.length} worker(s): ${failed.map((w) => w.worker).join(", ")}`);
    throw new ExitError(1);
  }
}
