import { defineCommand } from "citty";
import { commandContext } from "../_context.ts";
import { jobStatus } from "../../jobs/status.ts";
import { JobStore } from "../../jobs/store.ts";
import { formatAgo, formatSeconds, table } from "../../ui/output.ts";
import { PrintableOutput, printable } from "../../ui/escape.ts";
import { remoteTarget } from "../../cluster/client.ts";
import { count, outputArgs, rejectUnknownFlags, placeArgs } from "../_args.ts";
import type { JobListDoc } from "../_json.ts";

const args = { limit: { type: "string", default: "50", description: "How many jobs to show" }, ...placeArgs, ...outputArgs } as const;

export default defineCommand({
  meta: { name: "list", description: "List jobs, newest first, with state and phase durations" },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    const limit = count("--limit", a.limit);
    // Names and the like come from the job: shown with control characters escaped.
    const out = new PrintableOutput(a);
    const ctx = await commandContext({ server: a.server, token: a.token, token_file: a["token-file"] });
    const remote = remoteTarget(ctx.settings, [], { local: a.local });
    if (remote) return import("../_remote/views.ts").then((m) => m.remoteList(remote, limit, out));
    // A read: the store opened read-only; a job whose runner is gone is shown failed, nothing recorded or signalled.
    const store = new JobStore(ctx.layout, { readOnly: true });
    const statuses = store.list(limit).map((j) => jobStatus(store, j));
    store.close();
    const doc: JobListDoc = statuses.map(({ events: _e, ...s }) => s);
    out.result(
      doc,
      () => {
        if (!statuses.length) return "no jobs yet (gpulayer job run -p tqdm -- python -c 'import tqdm')";
        const rows = [["ID", "NAME", "STATE", "EXIT", "PREPARE", "RUN", "CREATED"]];
        for (const s of statuses) {
          if (s.tasks) {
            // A job of tasks: its tasks' phases added up, and how many of its tasks' envs were reused.
            const sum = (name: string) => s.tasks!.reduce((n, t) => n + (t.phases.find((p) => p.name === name)?.seconds ?? 0), 0);
            const preps = s.tasks.flatMap((t) => t.phases.filter((p) => p.name === "task.prepare"));
            const hits = preps.filter((p) => p.cache === "hit").length;
            rows.push([s.id, `${printable(s.name)} (${s.tasks.length} task${s.tasks.length === 1 ? "" : "s"})`, s.state, s.exit_code === null ? "-" : String(s.exit_code), preps.length ? `${formatSeconds(sum("task.prepare"))} ${hits}/${preps.length} hit` : "-", sum("task.run") ? formatSeconds(sum("task.run")) : "-", formatAgo(Date.parse(s.created))]);
            continue;
          }
          const prep = s.phases.find((p) => p.name === "task.prepare");
          const run = s.phases.find((p) => p.name === "task.run");
          rows.push([s.id, printable(s.name), s.state, s.exit_code === null ? "-" : String(s.exit_code), prep?.seconds != null ? `${formatSeconds(prep.seconds)}${prep.cache ? ` ${prep.cache}` : ""}` : "-", run?.seconds != null ? formatSeconds(run.seconds) : "-", formatAgo(Date.parse(s.created))]);
        }
        return table(rows);
      },
    );
  },
});
