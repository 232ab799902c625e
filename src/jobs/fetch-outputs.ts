import { lstatSync } from "node:fs";
import { join, resolve } from "node:path";
import { UsageError, UserError } from "../errors.ts";
import { copyOutputs, type OutputFile, sameFile } from "./outputs.ts";

/**
 * `job outputs`: what a job's tasks left, copied into a folder. One task's
 * (--task) at their paths in it; every task's, each under a folder named
 * after the task. Nothing is written when a file there would be replaced by
 * other bytes: one line names it.
 */

export interface TaskOutputs {
  name: string;
  files: OutputFile[];
}

export interface OutputsResult {
  id: string;
  dir: string;
  tasks: TaskOutputs[];
}

/** The tasks asked for (all, or the one --task names), or a line saying there is none such. */
export function chosenTasks<T extends { name: string }>(id: string, tasks: T[], task: string | undefined): T[] {
  if (task === undefined) return tasks;
  const one = tasks.filter((t) => t.name === task);
  if (!one.length) throw new UsageError(tasks.length ? `job ${id} has no task ${task} (tasks: ${tasks.map((t) => t.name).join(", ")})` : `--task: job ${id} is not a job of tasks`);
  return one;
}

/** Where a task's outputs go under `dir`. */
export const taskFolder = (dir: string, name: string, one: boolean): string => (one ? dir : join(dir, name));

/** Refused before anything is written: a file in the way that holds other bytes. */
export function checkDestination(dir: string, tasks: { name: string; files: OutputFile[]; from: (f: OutputFile) => string }[], one: boolean): void {
  for (const t of tasks) {
    for (const f of t.files) {
      const to = join(taskFolder(dir, t.name, one), f.path);
      if (lstatSync(to, { throwIfNoEntry: false }) && !sameFile(t.from(f), to)) throw new UserError(`${to} exists already and holds something else: give -o an empty folder`);
    }
  }
}

/** A local job's outputs, from the job store (jobs/kept-outputs.ts). */
export function copyKeptOutputs(id: string, kept: { name: string; dir: string; files: OutputFile[] }[], dir: string, one: boolean): OutputsResult {
  const out = resolve(dir);
  const missing = kept.find((t) => t.files.some((f) => !lstatSync(join(t.dir, f.path), { throwIfNoEntry: false })));
  if (missing) throw new UserError(`the outputs of task ${missing.name} are no longer kept in this machine's job store`);
  checkDestination(out, kept.map((t) => ({ ...t, from: (f: OutputFile) => join(t.dir, f.path) })), one);
  for (const t of kept) copyOutputs(t.dir, t.files, taskFolder(out, t.name, one));
  return { id, dir: out, tasks: kept.map((t) => ({ name: t.name, files: t.files })) };
}
