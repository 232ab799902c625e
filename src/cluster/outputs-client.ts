import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { namesOfDeadOwners } from "../core/dead-owners.ts";
import { BundleError, UserError } from "../errors.ts";
import { chosenTasks, copyKeptOutputs, type OutputsResult } from "../jobs/fetch-outputs.ts";
import { unpackBundle } from "./bundle.ts";
import { connect, type RemoteTarget } from "./client.ts";
import type { JobOutputsView } from "./protocol.ts";

/** A scratch folder of `job outputs` (its owner's pid first). */
const SCRATCH = /^gpulayer-outputs-(\d+)-[0-9a-f]{8}$/;

/**
 * `job outputs` through a server: each task's archive fetched, checked
 * against its hash, unpacked with the bundles' entry checks (no links out,
 * no `..`, the limits) into a scratch folder under the system's temporary
 * folder (a killed client's is removed by the next), then copied into place
 * as a local job's kept outputs are.
 */
export async function fetchRemoteOutputs(target: RemoteTarget, id: string, task: string | undefined, dir: string): Promise<OutputsResult> {
  const client = connect(target);
  const view = await client.json<JobOutputsView>("GET", `/v1/jobs/${encodeURIComponent(id)}/outputs`);
  const tasks = chosenTasks(view.id, view.tasks, task);
  for (const name of namesOfDeadOwners(tmpdir(), SCRATCH)) rmSync(join(tmpdir(), name), { recursive: true, force: true });
  const work = join(tmpdir(), `gpulayer-outputs-${process.pid}-${crypto.randomUUID().slice(0, 8)}`);
  mkdirSync(work, { recursive: true, mode: 0o700 });
  try {
    for (const t of tasks) {
      if (!t.bundle || !t.files.length) continue;
      const res = await client.request("GET", `/v1/bundles/${t.bundle}`).catch((error) => {
        throw (error as { status?: number }).status === 404 ? new UserError(`the outputs of task ${t.name} are no longer kept on the server (removed after GPULAYER_BUNDLE_RETENTION)`) : error;
      });
      const data = new Uint8Array(await res.arrayBuffer());
      if (new Bun.CryptoHasher("sha256").update(data).digest("hex") !== t.bundle) throw new BundleError(`the outputs of task ${t.name} arrived damaged (hash mismatch)`);
      const file = join(work, `${t.name}.tar.gz`);
      writeFileSync(file, data);
      await unpackBundle(file, join(work, t.name), target.bundleLimits);
    }
    // The files the server read from each archive (whose hash was checked): what the unpacked folder holds.
    const kept = tasks.map((t) => ({ name: t.name, dir: join(work, t.name), files: t.bundle ? t.files : [] }));
    return copyKeptOutputs(view.id, kept, dir, task !== undefined);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
