import { ExitCode } from "../errors.ts";
import type { HomeLayout } from "../config/paths.ts";
import { bootId, processStartTime } from "../core/process-identity.ts";
import { type JobOutcome, type RunnerIO, type RunnerSettings, type RunningJob, startJob } from "./runner.ts";
import { gpuRefusal } from "./resources.ts";
import { gpuDeviceIds, type LocalGpu } from "./allocation.ts";

export type { LocalGpu };
import { keepTaskOutputs, placeTaskInputs } from "./kept-outputs.ts";
import { inputsUnplacedLine } from "./outputs.ts";
import { type JobState, jobEnd, readiness, unstartedEnds } from "./model.ts";
import type { JobRecord, JobStore } from "./store.ts";

/**
 * A job of several tasks, run here: each task is a job record of its own
 * (its task.prepare and task.run, events and log; runner.ts runs it), started
 * once every task it needs has succeeded, up to `slots` at a time. A failed
 * task fails the job: what needs it (directly or not) is skipped, never
 * started; tasks running meanwhile finish, and tasks that do not need it go
 * on. The job's exit code is the first failed task's. A cancel cancels every
 * running task and every one not started yet. With the machine's GPUs known,
 * a task that needs N of them starts once N are free and sees only those
 * (CUDA_VISIBLE_DEVICES), as a worker's tasks do.
 */

export interface TasksIO {
  /** What one task's runner reports to (its output, prepare progress, events). */
  forTask(name: string): RunnerIO;
  /** A task started, finished, or was skipped or cancelled before it started. */
  onTask?(name: string, state: JobState | "started", detail: string | null): void;
}

export function startJobTasks(store: JobStore, layout: HomeLayout, job: JobRecord, settings: RunnerSettings & { slots: number; gpus?: LocalGpu[] | null }, io: TasksIO): RunningJob {
  const tasks = job.spec.tasks ?? [];
  const records = new Map(store.tasks(job.id, job.spec).map((r) => [r.task!, r]));
  const state = new Map<string, JobState | "waiting">(tasks.map((t) => [t.name, "waiting"]));
  const running = new Map<string, RunningJob>();
  const gpus = settings.gpus ?? null;
  const freeGpus = new Set((gpus ?? []).map((g) => g.index));
  const held = new Map<string, number[]>();
  const needsGpus = (name: string) => tasks.find((t) => t.name === name)!.spec.resources.gpus;
  let cancelReason: string | null = null;
  let firstFailure: { name: string; exitCode: number } | null = null;
  let settle: (outcome: JobOutcome) => void = () => undefined;
  const done = new Promise<JobOutcome>((resolve) => (settle = resolve));

  store.update(job.id, { state: "running", runnerPid: process.pid, runnerStart: processStartTime(process.pid), pidBoot: bootId() });

  /** Ended without starting (skipped after a failure, cancelled): recorded on the task and on the job. */
  const endUnstarted = (name: string, ended: "skipped" | "cancelled", because: string) => {
    const record = records.get(name)!;
    state.set(name, ended);
    store.update(record.id, { state: ended, error: because });
    store.event(record.id, `task.${ended}` as const, { because });
    store.event(job.id, `task.${ended}` as const, { task: name, because });
    io.onTask?.(name, ended, because);
  };

  /** A task that can never start here: more GPUs than the machine has (the one rule: resources.ts). */
  const failUnstartable = (name: string, because: string) => {
    const record = records.get(name)!;
    state.set(name, "failed");
    if (!firstFailure) firstFailure = { name, exitCode: ExitCode.failed };
    store.update(record.id, { state: "failed", exitCode: ExitCode.failed, error: because });
    store.event(record.id, "task.prepare.failed", { seconds: 0, message: because });
    store.event(job.id, "task.finished", { task: name, state: "failed", exit_code: ExitCode.failed });
    io.onTask?.(name, "failed", because);
  };

  const start = (name: string) => {
    let record = records.get(name)!;
    state.set(name, "running");
    const n = gpus ? needsGpus(name) : 0;
    if (n) {
      // The GPUs it is given, and no others; they are its until it ends.
      const mine = [...freeGpus].sort((a, b) => a - b).slice(0, n);
      for (const g of mine) freeGpus.delete(g);
      held.set(name, mine);
      record = { ...record, spec: { ...record.spec, env: { ...record.spec.env, CUDA_VISIBLE_DEVICES: gpuDeviceIds(gpus!, mine).join(",") } } };
    }
    store.event(job.id, "task.started", { task: name, id: record.id, ...(n ? { gpus: held.get(name) } : {}) });
    io.onTask?.(name, "started", null);
    // What the tasks it needs left (their declared outputs), at the same paths in its folder.
    const placed = (() => {
      try {
        placeTaskInputs(store, records, tasks, name);
        return null;
      } catch (error) {
        return inputsUnplacedLine(name, (error as Error).message);
      }
    })();
    const run = placed ? unstartable(record, placed) : startJob(store, layout, record, settings, io.forTask(name), n ? gpuDeviceIds(gpus!, held.get(name)!) : undefined);
    running.set(name, run);
    void run.done
      .catch((error: unknown): JobOutcome => {
        // A runner bug must not leave the job waiting forever: the task failed, and says why.
        store.update(record.id, { state: "failed", error: (error as Error).message });
        return { state: "failed", exitCode: ExitCode.internal, prepareSeconds: null, runSeconds: null };
      })
      .then((ran) => {
        // Its declared outputs, kept; one missing fails it.
        const kept = ran.state === "succeeded" ? keepTaskOutputs(store, record) : null;
        const outcome: JobOutcome = kept ? { ...ran, state: "failed", exitCode: ExitCode.failed } : ran;
        running.delete(name);
        for (const g of held.get(name) ?? []) freeGpus.add(g);
        held.delete(name);
        state.set(name, outcome.state);
        if (outcome.state === "failed" && !firstFailure) firstFailure = { name, exitCode: outcome.exitCode };
        store.event(job.id, "task.finished", { task: name, state: outcome.state, exit_code: outcome.exitCode });
        io.onTask?.(name, outcome.state, kept?.failed ?? `exit ${outcome.exitCode}`);
        step();
      });
  };

  /** A task that fails before its command: recorded as its runner would, with the reason. */
  const unstartable = (record: JobRecord, because: string): RunningJob => {
    store.update(record.id, { state: "failed", exitCode: ExitCode.failed, error: because });
    store.event(record.id, "task.prepare.failed", { seconds: 0, message: because });
    return { done: Promise.resolve({ state: "failed", exitCode: ExitCode.failed, prepareSeconds: null, runSeconds: null }), cancel: () => undefined };
  };

  const stateOf = (name: string) => state.get(name);

  const step = () => {
    // What can never start now (the needs rule: model/needs.ts), skips that cause more skips included.
    for (const e of unstartedEnds(tasks, stateOf, (name) => state.get(name) === "waiting", Boolean(cancelReason))) {
      endUnstarted(e.task, e.end, e.end === "cancelled" ? `the job was cancelled (${cancelReason})` : e.because!);
    }
    for (const t of tasks) {
      if (running.size >= settings.slots || cancelReason) break;
      if (state.get(t.name) !== "waiting" || !("ready" in readiness(t.needs, stateOf, false))) continue;
      const n = gpus ? t.spec.resources.gpus : 0;
      // Refused before the job was recorded (job run); met here only when the machine lost GPUs since.
      const refusal = gpus && gpuRefusal({ resources: t.spec.resources, tasks: [t] }, [gpus.length]);
      if (refusal) {
        failUnstartable(t.name, refusal);
        return step();
      }
      if (n > freeGpus.size) continue; // waits for GPUs other tasks hold
      start(t.name);
    }
    if (running.size === 0 && tasks.every((t) => state.get(t.name) !== "waiting")) finish();
  };

  const finish = () => {
    const end = jobEnd(
      tasks.map((t) => state.get(t.name)!),
      Boolean(cancelReason),
      firstFailure && { task: firstFailure.name, exitCode: firstFailure.exitCode },
    );
    if (cancelReason) store.event(job.id, "job.cancelled", { reason: cancelReason });
    store.event(job.id, "job.finished", end.event);
    store.update(job.id, { state: end.state, exitCode: end.exitCode, ...(end.error ? { error: end.error } : {}) });
    settle({ state: end.state, exitCode: end.exitCode, prepareSeconds: null, runSeconds: null });
  };

  const cancel = (reason: string) => {
    if (cancelReason) return;
    cancelReason = reason;
    for (const run of running.values()) run.cancel(reason);
    step();
  };

  step();
  return { done, cancel };
}
