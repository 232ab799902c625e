import { defineCommand } from "citty";
import { commandContext, engineHost } from "../_context.ts";
import { cancelJob } from "../../jobs/cancel.ts";
import { JobStore } from "../../jobs/store.ts";
import { Output } from "../../ui/output.ts";
import { remoteTarget } from "../../cluster/client.ts";
import { outputArgs, rejectUnknownFlags, placeArgs } from "../_args.ts";
import type { JobStateDoc } from "../_json.ts";

const args = { id: { type: "positional", required: true, valueHint: "ID", description: "Job id or a unique prefix of it" }, ...placeArgs, ...outputArgs } as const;

export default defineCommand({
  meta: { name: "cancel", description: "Stop a job and all its processes (SIGTERM, then SIGKILL after GPULAYER_CANCEL_GRACE seconds)" },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    const out = new Output(a);
    const ctx = await commandContext({ server: a.server, token: a.token, token_file: a["token-file"] });
    const remote = remoteTarget(ctx.settings, [], { local: a.local });
    if (remote) return (await import("../_remote/views.ts")).remoteCancel(remote, a.id, out);
    const store = new JobStore(ctx.layout);
    const job = await cancelJob(store, store.find(a.id), { cancelGraceMs: ctx.values.cancel_grace, engine: engineHost(ctx) });
    store.close();
    const doc: JobStateDoc = { id: job.id, state: job.state };
    out.result(doc, () => `job ${job.id} ${job.state}`);
  },
});
