import { defineCommand } from "citty";
import { commandContext, runnerSettings } from "../_context.ts";
import { UserError } from "../../errors.ts";
import { startJob } from "../../jobs/runner.ts";
import { JobStore } from "../../jobs/store.ts";

/** Internal: the background runner behind `job run --detach`. Output goes to the job's log only. */
export default defineCommand({
  meta: { name: "_exec", description: "(internal) run a queued job in the background", hidden: true },
  args: { id: { type: "positional", required: true } },
  async run({ args }) {
    const ctx = commandContext();
    const { layout } = ctx;
    const store = new JobStore(layout);
    const job = store.get(args.id);
    if (!job || job.state !== "queued") throw new UserError(`job ${args.id} is not queued`);
    // The spec with its credentials comes on stdin (see spawnDetachedRunner); the stored one is a fallback.
    const piped = await Bun.stdin.text().catch(() => "");
    const running = startJob(store, layout, piped ? { ...job, spec: JSON.parse(piped) } : job, runnerSettings(ctx));
    process.on("SIGTERM", () => running.cancel("job cancel"));
    process.on("SIGINT", () => running.cancel("SIGINT"));
    await running.done;
    store.close();
  },
});
