import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { type BundleLimits, packFiles } from "../cluster/bundle.ts";
import { type ClusterClient, untilServed } from "../cluster/client.ts";
import type { TaskAssignment } from "../cluster/protocol.ts";
import type { Lease } from "../core/lease.ts";
import { collectOutputs, copyOutputs, inputsUnplacedLine, keptFiles, missingOutputLine, type OutputFile } from "../jobs/outputs.ts";

/**
 * Files between tasks on a fleet (jobs/outputs.ts): a task's declared
 * outputs go to the server as an archive checked and kept as bundles are;
 * a task that needs it finds them in its folder, fetched by its worker with
 * its own credential (which reaches only the outputs of what its task needs).
 */

/** The worker's kept copy of an archive (unpacked once, after its entry checks: worker/tasks.ts useBundle), leased while read. */
export type KeptCopy = (hash: string) => Promise<{ dir: string; lease: Lease }>;

/** Before the task's command: the outputs of the tasks it needs, at their paths in its folder, in the job's order; null, or the line that fails it. */
export async function placeInputs(task: TaskAssignment, workdir: string, copyOf: KeptCopy): Promise<string | null> {
  try {
    for (const input of task.inputs ?? []) {
      const copy = await copyOf(input.bundle);
      try {
        copyOutputs(copy.dir, keptFiles(copy.dir), workdir);
      } finally {
        copy.lease.release();
      }
    }
    return null;
  } catch (error) {
    return inputsUnplacedLine(task.spec?.name ?? task.id, (error as Error).message);
  }
}

/**
 * At the task's success: its declared outputs sent to the server (none when
 * the globs matched nothing); or the line that fails it, when a declared path
 * is not there.
 */
export async function sendOutputs(client: ClusterClient, limits: BundleLimits, task: TaskAssignment, workdir: string, scratch: string, stopped: () => boolean): Promise<{ failed: string; missing: boolean } | { files: OutputFile[] }> {
  const name = task.spec?.name ?? task.id;
  const { files, missing } = collectOutputs(workdir, task.spec?.outputs ?? []);
  if (missing.length) return { failed: missingOutputLine(name, missing), missing: true };
  if (!files.length) return { files };
  // Named as a download in progress (NAME.PID.UUID.tmp): a killed worker's is swept when it starts again (worker/leftovers.ts).
  mkdirSync(scratch, { recursive: true, mode: 0o700 });
  const file = join(scratch, `outputs-${task.id}.tar.gz.${process.pid}.${crypto.randomUUID()}.tmp`);
  try {
    const pack = packFiles(workdir, files, file, limits, `the outputs of task ${name}`);
    // Asked again through an outage of the coordinator: a task that succeeded is not failed by it.
    await untilServed(() => client.request("PUT", `/v1/tasks/${task.id}/outputs/${pack.hash}`, Bun.file(file)), stopped);
    return { files };
  } catch (error) {
    return { failed: `task ${name}: its outputs could not be sent to the server: ${(error as Error).message}`, missing: false };
  } finally {
    rmSync(file, { force: true });
  }
}
