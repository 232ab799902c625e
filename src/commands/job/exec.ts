import { defineCommand } from "citty";
import { commandContext, localGpus, localSlots, runnerSettings } from "../_context.ts";
import { UserError } from "../../errors.ts";
import { startJob } from "../../jobs/runner.ts";
import { firstGpuIds } from "../../jobs/allocation.ts";
import { startJobTasks } from "../../jobs/job-tasks.ts";
import { JobStore } from "../../jobs/store.ts";

/** Internal: the background runner behind `job run --detach`. Output goes to the job's log only. */
export default defineCommand({
  meta: { name: "_exec", description: "(internal) run a queued job in the background", hidden: true },
  args: { id: { type: "positional", required: true } },
  async run({ args }) {
    const ctx = await commandContext();
    const { layout } = ctx;
    const store = new JobStore(layout);
    const job = store.get(args.id);
    if (!job || job.state !== "queued") throw new UserError(`job ${args.id} is not queued`);
    // The spec with its credentials comes on stdin (see spawnDetachedRunner); the stored one is a fallback.
    const piped = await Bun.stdin.text().catch(() => "");
    const record = piped ? { ...job, spec: JSON.parse(piped) } : job;
    // A job of tasks: each task's output goes to its own log (job logs JOB --task NAME).
    const running = record.spec.tasks ? startJobTasks(store, layout, record, { ...runnerSettings(ctx), slots: localSlots(ctx), gpus: await localGpus(ctx, record.spec) }, { forTask: () => ({}) }) : startJob(store, layout, record, runnerSettings(ctx), {}, firstGpuIds(await localGpus(ctx, record.spec), record.spec.resources.gpus));
    process.on("SIGTERM", () => running.cancel("job cancel"));
    process.on("SIGINT", () => running.cancel("SIGINT"));
    await running.done;
    store.close();
  },
});
