import type { JobStatus } from "../../jobs/status.ts";
import { formatSeconds, shortKey } from "../../ui/output.ts";

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
  lines.push("  events");
  for (const e of s.events) {
    const d = e.data as Record<string, unknown>;
    lines.push(`    ${e.time}  ${e.type}${typeof d.worker === "string" ? ` ${d.worker}` : ""}${typeof d.reason === "string" ? `: ${d.reason}` : ""}`);
  }
  return lines;
}
