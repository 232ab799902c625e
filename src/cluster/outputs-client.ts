import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { BundleError, UserError } from "../errors.ts";
import { checkDestination, chosenTasks, type OutputsResult, taskFolder } from "../jobs/fetch-outputs.ts";
import { copyOutputs, keptFiles } from "../jobs/outputs.ts";
import { unpackBundle } from "./bundle.ts";
import { connect, type RemoteTarget } from "./client.ts";
import type { JobOutputsView } from "./protocol.ts";

/**
 * `job outputs` through a server: each task's archive fetched, checked
 * against its hash, unpacked with the bundles' entry checks (no links out,
 * no `..`, the limits) into a scratch folder, then copied into place.
 */
export async function fetchRemoteOutputs(target: RemoteTarget, id: string, task: string | undefined, dir: string, scratch: string): Promise<OutputsResult> {
  const client = connect(target);
  const view = await client.json<JobOutputsView>("GET", `/v1/jobs/${encodeURIComponent(id)}/outputs`);
  const tasks = chosenTasks(view.id, view.tasks, task);
  const one = task !== undefined;
  const out = resolve(dir);
  const work = join(scratch, `outputs-${view.id}-${process.pid}-${crypto.randomUUID().slice(0, 8)}`);
  mkdirSync(work, { recursive: true });
  try {
    const unpacked: { name: string; dir: string }[] = [];
    for (const t of tasks) {
      if (!t.bundle || !t.files.length) continue;
      const res = await client.request("GET", `/v1/bundles/${t.bundle}`).catch((error) => {
        throw (error as { status?: number }).status === 404 ? new UserError(`the outputs of task ${t.name} are no longer kept on the server (removed after GPULAYER_BUNDLE_RETENTION)`) : error;
      });
      const data = new Uint8Array(await res.arrayBuffer());
      if (new Bun.CryptoHasher("sha256").update(data).digest("hex") !== t.bundle) throw new BundleError(`the outputs of task ${t.name} arrived damaged (hash mismatch)`);
      const file = join(work, `${t.name}.tar.gz`);
      writeFileSync(file, data);
      const to = join(work, t.name);
      await unpackBundle(file, to, target.bundleLimits);
      unpacked.push({ name: t.name, dir: to });
    }
    const kept = unpacked.map((u) => ({ ...u, files: keptFiles(u.dir) }));
    checkDestination(out, kept.map((k) => ({ ...k, from: (f: { path: string }) => join(k.dir, f.path) })), one);
    for (const k of kept) copyOutputs(k.dir, k.files, taskFolder(out, k.name, one));
    return { id: view.id, dir: out, tasks: tasks.map((t) => ({ name: t.name, files: t.files })) };
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
