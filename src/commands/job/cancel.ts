import { defineCommand } from "citty";
import { jobIdPrefix } from "../../jobs/job-id.ts";
import { placeContext } from "../_place.ts";
import { engineHost } from "../_context.ts";
import { cancelJob } from "../../jobs/cancel.ts";
import { JobStore } from "../../jobs/store.ts";
import { outputArgs, placeArgs } from "../_args.ts";
import type { JobStateDoc } from "../_json.ts";

const args = { id: { type: "positional", required: true, valueHint: "ID", description: "Job id or a unique prefix of it" }, ...placeArgs, ...outputArgs } as const;

export default defineCommand({
  meta: { name: "cancel", description: "Stop a job and all its processes (SIGTERM, then SIGKILL after GPULAYER_CANCEL_GRACE seconds)" },
  args,
  async run({ args: a, rawArgs }) {
    const { out, ctx, remote } = await placeContext(a, rawArgs, args);
    // Checked here, before a server is asked: the same words either way.
    const id = jobIdPrefix(a.id);
    if (remote) return (await import("../_remote/views.ts")).remoteCancel(remote, id, out);
    const store = new JobStore(ctx.layout);
    const job = await cancelJob(store, store.find(id), { cancelGraceMs: ctx.values.cancel_grace, engine: engineHost(ctx) });
    store.close();
    const doc: JobStateDoc = { id: job.id, state: job.state };
    out.result(doc, () => `job ${job.id} ${job.state}`);
  },
});
