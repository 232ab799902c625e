import { cancelGraceMs } from "../../jobs/runner.ts";
import { formatAgo, formatSeconds, type Output, shortKey, table } from "../../ui/output.ts";
import { ClusterClient, type RemoteTarget } from "../../cluster/client.ts";
import type { RemoteJobStatus } from "../../cluster/protocol.ts";
import { cancelRemoteJob, followJob } from "./job.ts";

/**
 * `job status/list/logs/cancel` against a server: the command layer of the
 * remote branches. Same JSON shapes as the local ones (src/jobs/status.ts),
 * plus where each job ran.
 */

function statusLines(s: RemoteJobStatus): string[] {
  const lines = [`job ${s.id} ${s.name}: ${s.state}${s.exit_code !== null ? `, exit ${s.exit_code}` : ""}`, `  command  ${s.command}`, `  worker   ${s.worker ?? "-"}${s.attempts > 1 ? ` (attempt ${s.attempts})` : ""}`];
  if (s.waiting && s.state === "queued") lines.push(`  waiting  for ${s.waiting}`);
  if (s.error) lines.push(`  error    ${s.error}`);
  for (const p of s.phases) {
    const secs = p.seconds !== null ? formatSeconds(p.seconds) : "-";
    if (p.name === "task.prepare") {
      lines.push(`  prepare  ${secs} ${p.state === "finished" ? `(${p.status}, cache ${p.cache}, env ${shortKey(p.env_key ?? "")})` : `(${p.state})`}`);
      if (p.message) lines.push(...p.message.split("\n").map((l) => `           ${l}`));
    } else lines.push(`  run      ${secs} ${p.state === "finished" ? `(exit ${p.exit_code})` : `(${p.state})`}`);
  }
  lines.push("  events");
  for (const e of s.events) lines.push(`    ${e.time}  ${e.type}${typeof e.data.worker === "string" ? ` ${e.data.worker}` : ""}${typeof e.data.reason === "string" ? `: ${e.data.reason}` : ""}`);
  return lines;
}

export async function remoteStatus(target: RemoteTarget, id: string, out: Output): Promise<void> {
  const client = new ClusterClient(target.url, target.token);
  const status = await client.json<RemoteJobStatus>("GET", `/v1/jobs/${encodeURIComponent(id)}`);
  out.result(status, () => statusLines(status));
}

export async function remoteList(target: RemoteTarget, limit: number, out: Output): Promise<void> {
  const client = new ClusterClient(target.url, target.token);
  const statuses = await client.json<Omit<RemoteJobStatus, "events">[]>("GET", `/v1/jobs?limit=${limit}`);
  out.result(statuses, () => {
    if (!statuses.length) return `no jobs on ${target.url} yet`;
    const rows = [["ID", "NAME", "STATE", "EXIT", "WORKER", "PREPARE", "RUN", "CREATED"]];
    for (const s of statuses) {
      const prep = s.phases.find((p) => p.name === "task.prepare");
      const run = s.phases.find((p) => p.name === "task.run");
      rows.push([s.id, s.name, s.state, s.exit_code === null ? "-" : String(s.exit_code), s.worker ?? "-", prep?.seconds != null ? `${formatSeconds(prep.seconds)}${prep.cache ? ` ${prep.cache}` : ""}` : "-", run?.seconds != null ? formatSeconds(run.seconds) : "-", formatAgo(Date.parse(s.created))]);
    }
    return table(rows);
  });
}

export async function remoteLogs(target: RemoteTarget, id: string, follow: boolean): Promise<void> {
  const client = new ClusterClient(target.url, target.token);
  const write = (c: Uint8Array) => process.stdout.write(c);
  if (follow) {
    await followJob(client, id, { onOutput: write });
    return;
  }
  const { data } = await client.bytes(`/v1/jobs/${encodeURIComponent(id)}/log`);
  write(data);
}

export async function remoteCancel(target: RemoteTarget, id: string, out: Output): Promise<void> {
  const job = await cancelRemoteJob(target, id, cancelGraceMs());
  out.result(job, () => `job ${job.id} ${job.state}`);
}
