import type { MachineProbe, WorkerView } from "../cluster/protocol.ts";
import type { ProbeDoc, WorkersDoc } from "./_json.ts";

/** A machine probe in a --json document (join, workers): snake_case keys; package names and versions as found. */
export function probeJson(p: MachineProbe): ProbeDoc {
  return {
    hostname: p.hostname,
    os: p.os,
    arch: p.arch,
    cpus: p.cpus,
    memory_bytes: p.memoryBytes,
    gpus: p.gpus.map((g) => ({ index: g.index, uuid: g.uuid, name: g.name, memory_mib: g.memoryMiB, driver: g.driver })),
    python: p.python ? { path: p.python.path, version: p.python.version } : null,
    python_error: p.pythonError ?? null,
    frameworks: p.frameworks,
    cuda: p.cuda,
    engine: p.engine,
    conda: p.conda ?? [],
    probe_ms: p.probeMs,
  };
}

/** `workers --json`: the server's view of each worker, its probe in snake_case. */
export function workersJson(workers: WorkerView[]): WorkersDoc {
  return workers.map((w) => ({
    id: w.id,
    name: w.name,
    labels: w.labels,
    joined_with: w.joined_with ?? null,
    state: w.state,
    registered: w.registered,
    last_seen: w.last_seen,
    slots: w.slots,
    running: w.running,
    free_gpus: w.free_gpus,
    probe: probeJson(w.probe),
    prefetch: w.cache?.prefetch ?? null,
  }));
}
