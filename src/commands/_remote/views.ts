import { formatAgo, formatSeconds, type Output, table } from "../../ui/output.ts";
import { ClusterClient, type RemoteTarget } from "../../cluster/client.ts";
import type { RemoteJobStatus } from "../../cluster/protocol.ts";
import { cancelRemoteJob, followJob } from "./job.ts";
import { statusLines } from "../job/_lines.ts";

/**
 * `job status/list/logs/cancel` against a server: the command layer of the
 * remote branches. Same JSON shapes as the local ones (src/jobs/status.ts),
 * plus where each job ran.
 */

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
  const job = await cancelRemoteJob(target, id, target.cancelGraceMs);
  out.result(job, () => `job ${job.id} ${job.state}`);
}
