import { defineCommand } from "citty";
import { homeLayout } from "../../config/paths.ts";
import { reconcile } from "../../jobs/detach.ts";
import { jobStatus } from "../../jobs/status.ts";
import { JobStore } from "../../jobs/store.ts";
import { Output } from "../../ui/output.ts";
import { statusLines } from "./_lines.ts";
import { remoteTarget } from "../../cluster/client.ts";
import { outputArgs, rejectUnknownFlags, serverArgs } from "../_args.ts";

const args = { id: { type: "positional", required: true, valueHint: "ID", description: "Job id or a unique prefix of it" }, ...serverArgs, ...outputArgs } as const;

export default defineCommand({
  meta: { name: "status", description: "Show a job's state, its prepare and run phases with durations, cache hit or miss, exit code, events" },
  args,
  run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    const out = new Output(a);
    const remote = remoteTarget(a);
    if (remote) return import("../_remote/views.ts").then((m) => m.remoteStatus(remote, a.id, out));
    const store = new JobStore(homeLayout());
    const status = jobStatus(store, reconcile(store, store.find(a.id)));
    store.close();
    out.result(status, () => statusLines(status));
  },
});
