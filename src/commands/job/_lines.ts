import type { JobStatus } from "../../jobs/model.ts";
import type { DryRunJob } from "../../jobs/dry-run.ts";
import { formatBytes, formatSeconds, shortKey } from "../../ui/output.ts";

/** Where a job ran, when a server reports it. */
type Placement = { worker?: string | null; attempts?: number; waiting?: string | null };

/** `job status` for people, local or remote: state, the two phases timed apart, events. */
export function statusLines(s: JobStatus & Placement): string[] {
  const lines = [`job ${s.id} ${s.name}: ${s.state}${s.exit_code !== null ? `, exit ${s.exit_code}` : ""}`, `  command  ${s.command}`];
  if (s.worker !== undefined) lines.push(`  worker   ${s.worker ?? "-"}${(s.attempts ?? 1) > 1 ? ` (attempt ${s.attempts})` : ""}`);
  if (s.waiting && s.state === "queued") lines.push(`  waiting  for ${s.waiting}`);
  if (s.error) lines.push(`  error    ${s.error}`);
  for (const p of s.phases) {
    const secs = p.seconds !== null ? formatSeconds(p.seconds) : "-";
    if (p.name === "task.prepare") {
      const what = p.image ? `image ${p.image}${p.env_key ? ` + env ${shortKey(p.env_key)}` : ""}` : `env ${shortKey(p.env_key ?? "")}`;
      lines.push(`  prepare  ${secs} ${p.state === "finished" ? `(${p.status}, cache ${p.cache}, ${what})` : `(${p.state})`}`);
      if (p.message) lines.push(...p.message.split("\n").map((l) => `           ${l}`));
    } else lines.push(`  run      ${secs} ${p.state === "finished" ? `(exit ${p.exit_code})` : `(${p.state})`}`);
  }
  if (s.tasks) {
    lines.push("  tasks");
    const width = Math.max(...s.tasks.map((t) => t.name.length));
    for (const t of s.tasks) {
      const prepare = t.phases.find((p) => p.name === "task.prepare");
      const run = t.phases.find((p) => p.name === "task.run");
      const timing = [
        prepare && `prepare ${prepare.seconds !== null ? formatSeconds(prepare.seconds) : "-"}${prepare.cache ? ` (cache ${prepare.cache})` : ""}`,
        run && `run ${run.seconds !== null ? formatSeconds(run.seconds) : "-"}`,
      ].filter(Boolean);
      const ended = t.exit_code !== null && t.state !== "running" ? `, exit ${t.exit_code}` : "";
      lines.push(`    ${t.name.padEnd(width)}  ${t.state}${ended}${timing.length ? `; ${timing.join(", ")}` : ""}${t.needs.length ? `; needs ${t.needs.join(", ")}` : ""}`);
      if (t.error && (t.state === "skipped" || t.state === "failed" || t.state === "cancelled")) lines.push(`    ${" ".repeat(width)}  ${t.error}`);
      if (t.outputs?.length) lines.push(`    ${" ".repeat(width)}  outputs ${t.outputs.map((o) => `${o.path} (${formatBytes(o.bytes)})`).join(", ")}`);
    }
  }
  lines.push("  events");
  for (const e of s.events) {
    const d = e.data as Record<string, unknown>;
    lines.push(`    ${e.time}  ${e.type}${typeof d.task === "string" ? ` ${d.task}` : ""}${typeof d.worker === "string" ? ` ${d.worker}` : ""}${typeof d.reason === "string" ? `: ${d.reason}` : ""}`);
  }
  return lines;
}

/** `job run --dry-run` for people: each task, its command, env and key, variables by name, what it needs. */
export function dryRunLines(plan: DryRunJob): string[] {
  const lines = [`job ${plan.name}: ${plan.tasks.length} task(s), nothing run`];
  for (const t of plan.tasks) {
    const e = t.environment;
    lines.push(`task ${t.name}`, `  command  ${t.command}`, `  workdir  ${t.workdir}`);
    if (e.image) lines.push(`  image    ${e.image}${e.summary ? ` + ${e.summary}` : ""}`);
    else lines.push(`  env      ${e.key} (would ${e.would}: ${e.summary}; python ${e.python}${e.conda ? `; conda ${e.conda}` : ""})`);
    lines.push(`  vars     ${t.env.length ? t.env.join(", ") : "-"}`, `  needs    ${t.needs.length ? t.needs.join(", ") : "-"}`);
    if (t.resources.gpus || Object.keys(t.resources.frameworks).length) lines.push(`  needs    ${t.resources.gpus} GPU(s)${Object.entries(t.resources.frameworks).map(([k, v]) => `, ${k}${v}`).join("")}`);
  }
  return lines;
}
