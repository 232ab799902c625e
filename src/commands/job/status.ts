import { defineCommand } from "citty";
import { jobIdPrefix } from "../../jobs/job-id.ts";
import { commandContext } from "../_context.ts";
import { jobStatus } from "../../jobs/status.ts";
import { JobStore } from "../../jobs/store.ts";
import { PrintableOutput } from "../../ui/escape.ts";
import { statusLines } from "./_lines.ts";
import { remoteTarget } from "../../cluster/client.ts";
import { outputArgs, rejectUnknownFlags, placeArgs } from "../_args.ts";
import type { JobStatusDoc } from "../_json.ts";

const args = { id: { type: "positional", required: true, valueHint: "ID", description: "Job id or a unique prefix of it" }, ...placeArgs, ...outputArgs } as const;

export default defineCommand({
  meta: { name: "status", description: "Show a job's state, its prepare and run phases with durations, cache hit or miss, exit code, events" },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    // Checked here, before a server is asked: the same words either way.
    const id = jobIdPrefix(a.id);
    // Names, commands and messages come from the job: shown with control characters escaped.
    const out = new PrintableOutput(a);
    const ctx = await commandContext({ server: a.server, token: a.token, token_file: a["token-file"] });
    const remote = remoteTarget(ctx.settings, [], { local: a.local });
    if (remote) return import("../_remote/views.ts").then((m) => m.remoteStatus(remote, id, out));
    // A read: the store opened read-only; a job whose runner is gone is shown failed, nothing recorded or signalled.
    const store = new JobStore(ctx.layout, { readOnly: true });
    // jobStatus builds the document (snake_case keys; its schema: JobStatusDocument).
    const status: JobStatusDoc = jobStatus(store, store.find(id));
    store.close();
    out.result(status, () => statusLines(status));
  },
});
