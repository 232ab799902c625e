import { rmSync } from "node:fs";
import { ExitCode } from "../errors.ts";
import { collectOutputs, copyOutputs, missingOutputLine, neededTasks, type OutputFile } from "./outputs.ts";
import type { JobRecord, JobStore } from "./store.ts";
import type { TaskSpec } from "./spec.ts";
import { outputsOfEvents } from "./model.ts";

/**
 * A local job's task outputs (jobs/outputs.ts), kept in the job store: taken
 * when a task succeeds, put into the folder of each task that needs it before
 * that one starts. The `task.outputs` event lists them (what `job status`
 * shows); a declared path that is not there fails the task, with one line.
 */

/** The files a task's `task.outputs` event lists (none when it has none). */
export const outputsOf = (store: JobStore, id: string): OutputFile[] => outputsOfEvents(store.events(id));

/** At a task's success: its outputs copied into the store; or the task failed, with the line that says which is missing or why they could not be kept. */
export function keepTaskOutputs(store: JobStore, record: JobRecord): { failed: string } | null {
  const declared = record.spec.outputs ?? [];
  if (!declared.length) return null;
  const { files, missing } = collectOutputs(record.spec.workdir, declared);
  if (missing.length) {
    const line = missingOutputLine(record.task ?? record.name, missing);
    store.update(record.id, { state: "failed", exitCode: ExitCode.failed, error: line });
    store.event(record.id, "task.outputs.missing", { message: line });
    return { failed: line };
  }
  const dir = store.outputsDir(record.id);
  try {
    rmSync(dir, { recursive: true, force: true });
    copyOutputs(record.spec.workdir, files, dir);
  } catch (error) {
    // A full disk, a file it may not read: the task failed, with the reason, never a job left running.
    const line = `task ${record.task ?? record.name}: its outputs could not be kept: ${(error as Error).message}`;
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch {
      // What was copied is listed nowhere (no task.outputs event), so never read; the failure to tell is the one above.
    }
    store.update(record.id, { state: "failed", exitCode: ExitCode.failed, error: line });
    store.event(record.id, "task.outputs.failed", { message: line });
    return { failed: line };
  }
  store.event(record.id, "task.outputs", { files });
  return null;
}

/** Before a task starts: the outputs of every task it needs (directly or not) at their paths in its folder, in the job's order. */
export function placeTaskInputs(store: JobStore, records: Map<string, JobRecord>, tasks: TaskSpec[], name: string): void {
  const to = records.get(name)!.spec.workdir;
  for (const n of neededTasks(tasks, name)) {
    const from = records.get(n)!;
    copyOutputs(store.outputsDir(from.id), outputsOf(store, from.id), to);
  }
}
