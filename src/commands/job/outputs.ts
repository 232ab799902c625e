import { defineCommand } from "citty";
import { jobIdPrefix } from "../../jobs/job-id.ts";
import { commandContext } from "../_context.ts";
import { JobStore } from "../../jobs/store.ts";
import { remoteTarget } from "../../cluster/client.ts";
import { outputArgs, placeArgs, rejectUnknownFlags } from "../_args.ts";
import { Output, formatBytes } from "../../ui/output.ts";
import { chosenTasks, copyKeptOutputs } from "../../jobs/fetch-outputs.ts";
import { outputsOf } from "../../jobs/kept-outputs.ts";
import type { JobOutputsDoc } from "../_json.ts";

const args = {
  id: { type: "positional", required: true, valueHint: "ID", description: "Job id or a unique prefix of it" },
  task: { type: "string", valueHint: "NAME", description: "This task's outputs only, at their paths in DIR (without it: each task's, in DIR/NAME)" },
  output: { type: "string", alias: "o", valueHint: "DIR", description: "Where to put them (default: the current folder)" },
  ...placeArgs,
  ...outputArgs,
} as const;

export default defineCommand({
  meta: { name: "outputs", description: "Fetch the files a job's tasks left (their declared outputs), from this machine or a server" },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    // Checked here, before a server is asked: the same words either way.
    const id = jobIdPrefix(a.id);
    const out = new Output(a);
    const ctx = await commandContext({ server: a.server, token: a.token, token_file: a["token-file"] });
    const dir = a.output ?? ".";
    const remote = remoteTarget(ctx.settings, [], { local: a.local });
    const result = remote
      ? await (await import("../../cluster/outputs-client.ts")).fetchRemoteOutputs(remote, id, a.task, dir)
      : (() => {
          const store = new JobStore(ctx.layout, { readOnly: true });
          const job = store.find(id);
          const tasks = chosenTasks(job.id, store.tasks(job.id).map((t) => ({ name: t.task!, id: t.id })), a.task);
          const kept = tasks.map((t) => ({ name: t.name, dir: store.outputsDir(t.id), files: outputsOf(store, t.id) }));
          store.close();
          return copyKeptOutputs(job.id, kept, dir, a.task !== undefined);
        })();
    const doc: JobOutputsDoc = { id: result.id, dir: result.dir, tasks: result.tasks.map((t) => ({ name: t.name, files: t.files.map((f) => ({ path: f.path, bytes: f.bytes })) })) };
    out.result(doc, () => {
      const n = doc.tasks.reduce((k, t) => k + t.files.length, 0);
      const lines = [`job ${doc.id}: ${n} file(s) into ${doc.dir}`];
      for (const t of doc.tasks) lines.push(`  ${t.name}: ${t.files.length ? t.files.map((f) => `${f.path} (${formatBytes(f.bytes)})`).join(", ") : "no outputs"}`);
      return lines;
    });
  },
});
