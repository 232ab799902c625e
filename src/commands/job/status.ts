import { defineCommand } from "citty";
import { homeLayout } from "../../config/paths.ts";
import { reconcile } from "../../jobs/detach.ts";
import { jobStatus } from "../../jobs/status.ts";
import { JobStore } from "../../jobs/store.ts";
import { formatSeconds, Output, shortKey } from "../../ui/output.ts";
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
    out.result(status, () => {
      const lines = [`job ${status.id} ${status.name}: ${status.state}${status.exit_code !== null ? `, exit ${status.exit_code}` : ""}`, `  command  ${status.command}`];
      for (const p of status.phases) {
        const secs = p.seconds !== null ? formatSeconds(p.seconds) : "-";
        if (p.name === "task.prepare") {
          lines.push(`  prepare  ${secs} ${p.state === "finished" ? `(${p.status}, cache ${p.cache}, env ${shortKey(p.env_key ?? "")})` : `(${p.state})`}`);
          if (p.message) lines.push(...p.message.split("\n").map((l) => `           ${l}`));
        } else lines.push(`  run      ${secs} ${p.state === "finished" ? `(exit ${p.exit_code})` : `(${p.state})`}`);
      }
      lines.push("  events");
      for (const e of status.events) lines.push(`    ${e.time}  ${e.type}`);
      return lines;
    });
  },
});
