import type { MachineProbe, RegisterResponse } from "../cluster/protocol.ts";
import { contentHash as sha256 } from "../core/hashing.ts";
import { HttpFail } from "./http-fail.ts";
import { printable } from "../ui/escape.ts";
import { newId, type ServerStore, type TaskRow, type WorkerRow } from "./store.ts";

/** One change under the writer lock (coordinator.ts Change), by shape. */
interface Change {
  readonly store: ServerStore;
  wake(key: string): void;
  log(line: string): void;
}

/**
 * Workers joining. A worker keeps the id and credential it was given in its
 * home and presents them when it starts again: the server takes it back as
 * the same worker (new probe, idle, a new credential; what the dead process
 * ran goes back to the queue) instead of adding a second one. A credential
 * it does not know (its home was wiped) is a new worker. Two live processes
 * never hold one worker, nor one name on a host: while the one there still
 * beats, the newcomer is refused (409) and told when to try again.
 */

export interface RegisterBody {
  name: string;
  labels: Record<string, string>;
  slots: number;
  probe: MachineProbe;
  resume?: { id: string; credential: string };
}

/** What registering needs of the coordinator; by shape, since coordinator.ts imports this file. */
export interface Registrar {
  readonly opts: { heartbeatSeconds: number; lostSeconds: number; leaseSeconds: number };
  markLost(ch: Change, w: WorkerRow, reason: string, release?: boolean): Promise<void>;
  releaseTask(ch: Change, t: TaskRow, reason: string, lost: boolean): Promise<void>;
  dispatch(ch: Change): Promise<void>;
}

/** A worker heard from within this window still runs: a few heartbeats, at most the time after which it is lost. */
export function liveWindowMs(opts: { heartbeatSeconds: number; lostSeconds: number }): number {
  return Math.min(opts.lostSeconds, 3 * opts.heartbeatSeconds) * 1000;
}

const ago = (ms: number) => `${(ms / 1000).toFixed(1)} s ago`;

function refuseIfLive(c: Registrar, w: WorkerRow, now: number, message: (silentMs: number) => string): void {
  if (w.state === "lost" || w.state === "left") return;
  const silent = now - w.lastSeen;
  const window = liveWindowMs(c.opts);
  if (silent < window) throw new HttpFail(409, message(silent), { live: true, retry_after: Math.ceil(window - silent) / 1000 });
}

/** `joinedWith`: the named join token it came with, or null for the server's own token. */
export async function registerWorker(c: Registrar, ch: Change, body: RegisterBody, joinedWith: string | null): Promise<RegisterResponse> {
  const { store } = ch;
  const now = Date.now();
  const known = body.resume ? await store.workerBySecret(sha256(body.resume.credential)) : null;
  const same = known && known.id === body.resume?.id && known.name === body.name ? known : null;
  if (same) {
    refuseIfLive(c, same, now, (s) => `worker ${body.name} is already running (the server heard from it ${ago(s)}): another gpulayer join with this name and GPULAYER_HOME is still running; stop it first, or give this one another --name and GPULAYER_HOME`);
  }
  for (const old of (await store.workers({ present: true, name: body.name })).filter((w) => w.id !== same?.id)) {
    if (old.probe.hostname !== body.probe.hostname) throw new HttpFail(409, `a worker named ${body.name} is already connected from ${old.probe.hostname}; give this one another --name`);
    refuseIfLive(c, old, now, (s) => `a worker named ${body.name} is already running on ${old.probe.hostname} (the server heard from it ${ago(s)}); stop it first, or give this one another --name`);
    // The same machine back without its credential (a wiped home), the old process gone: that registration is over.
    await c.markLost(ch, old, `worker ${old.name} registered again`, true);
  }
  const credential = `gplw_${newId(24)}`;
  const gpus = body.probe.gpus.map((g) => g.index);
  // For the server's log: what a worker sends is escaped there, so no label forges a line or drives the terminal.
  const labels = printable(Object.entries(body.labels).map(([k, v]) => `${k}=${v}`).join(",") || "-");
  let id: string;
  if (same) {
    id = same.id;
    // The process that held these died: what it ran is gone with it.
    for (const t of await store.activeTasks(id)) await c.releaseTask(ch, t, `worker ${same.name} restarted`, true);
    await store.setWorkerSecret(id, sha256(credential));
    await store.updateWorker(id, { state: "idle", lastSeen: now, probe: body.probe, labels: body.labels, slots: body.slots, freeGpus: gpus, joinedWith });
    // A poll still open for the old credential ends now.
    ch.wake(`worker:${id}`);
    ch.log(`worker ${body.name} is back (same worker ${id}, was ${same.state}; ${printable(body.probe.hostname)}, ${gpus.length} GPU(s), labels ${labels})`);
  } else {
    id = newId(6);
    await store.addWorker({ id, name: body.name, labels: body.labels, probe: body.probe, slots: body.slots, state: "idle", registered: now, lastSeen: now, joinedWith }, sha256(credential));
    ch.log(`worker ${body.name} joined (${printable(body.probe.hostname)}, ${gpus.length} GPU(s), labels ${labels})`);
  }
  await c.dispatch(ch);
  return { id, name: body.name, credential, heartbeat_seconds: c.opts.heartbeatSeconds, lease_seconds: c.opts.leaseSeconds, resumed: Boolean(same) };
}
