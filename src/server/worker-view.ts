import type { WorkerView } from "../cluster/protocol.ts";
import type { ServerStore } from "./store.ts";

/** Each worker as clients see it: its state (busy when it runs a job), what runs there, which GPUs are free. */
export async function workerView(store: ServerStore): Promise<WorkerView[]> {
  const active = await store.activeTasks();
  return (await store.workers()).map((w) => {
    const mine = active.filter((t) => t.workerId === w.id && t.kind === "job");
    const used = new Set(mine.flatMap((t) => t.gpus));
    const state = w.state === "idle" && mine.length ? "busy" : w.state;
    return { id: w.id, name: w.name, labels: w.labels, joined_with: w.joinedWith, state, registered: new Date(w.registered).toISOString(), last_seen: new Date(w.lastSeen).toISOString(), slots: w.slots, running: mine.length, free_gpus: w.probe.gpus.map((g) => g.index).filter((i) => !used.has(i)), probe: w.probe, cache: w.cache };
  });
}
