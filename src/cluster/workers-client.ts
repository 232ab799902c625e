import { connect, type RemoteTarget } from "./client.ts";
import type { WorkerView } from "./protocol.ts";

/** The coordinator's workers: those connected, or (all) also those that left or were lost. */
export async function listWorkers(target: RemoteTarget, opts: { all?: boolean } = {}): Promise<WorkerView[]> {
  const workers = await connect(target).json<WorkerView[]>("GET", "/v1/workers");
  return opts.all ? workers : workers.filter((w) => w.state !== "left" && w.state !== "lost");
}
