import { type ClusterClient, isUnavailable } from "../cluster/client.ts";
import { HttpError } from "../errors.ts";
import type { ReportItemWire, ReportsRequest, TaskEventIn } from "../cluster/protocol.ts";
import { runsOf } from "../core/runs.ts";
import type { JobEventData, JobEventName, RelayMark } from "../jobs/model.ts";
import { sleep } from "../core/sleep.ts";
import type { Outbox, OutboxItem } from "./outbox.ts";

type Stream = "stdout" | "stderr";

const MAX_OUTPUT_POST = 1024 * 1024;
/** Items of several kinds go in one request up to this much (output travels base64 there). */
const MAX_MIXED_REPORT = 64 * 1024;
/** Clients of a server without `/reports` (an older version): items go by kind to it until then (its replicas may be upgraded meanwhile). */
const byKindUntil = new WeakMap<ClusterClient, number>();
const BY_KIND_MS = 10 * 60 * 1000;

/**
 * A task's events, output and final state on their way to the server, in
 * the order they happened, through the worker's outbox (outbox.ts): each item
 * is on disk before it is sent and stays there until the server acknowledges
 * it, numbered so that the server applies it once. One request at a time;
 * whatever piled up meanwhile goes in the next one (a chatty job costs few
 * requests, a quiet one's first line leaves at once), of several kinds at
 * once when they are small (`/reports`: a short job's events, output and end
 * in one request; by kind to a server older than that). Network trouble (and
 * 502/503/504: no replica can serve now) is retried for as long as it lasts;
 * a 409 means the server took the task back (its worker was declared lost),
 * and the task is stopped, as it is on a 401 (the worker's credential was
 * replaced); its items are dropped then.
 */
export class TaskChannel {
  private pumping: Promise<void> | null = null;
  private wanted = false;
  /** Nothing more is sent (the task was taken back). */
  muted = false;
  /** Nothing more is taken but a handback: what was written before still goes. */
  private sealed = false;

  constructor(
    private readonly client: ClusterClient,
    private readonly taskId: string,
    private readonly outbox: Outbox,
    private readonly onRevoked: (message: string) => void,
    private readonly log: (message: string) => void,
  ) {}

  event<N extends JobEventName>(type: N, data: JobEventData[N] & RelayMark): void {
    this.push("event", JSON.stringify({ ts: Date.now(), type, data } satisfies TaskEventIn));
  }

  output(chunk: Uint8Array, stream: Stream): void {
    if (chunk.length) this.push("output", chunk.slice(), stream);
  }

  /** The task's final state: the last item; delivered after everything before it. */
  finish(body: Record<string, unknown>): void {
    this.push("finish", JSON.stringify(body));
  }

  /** From now on only `handback` is taken: what the task does while it is being stopped is not the server's any more. */
  seal(): void {
    this.sealed = true;
  }

  /** The task given back to be run elsewhere: the last item, as durable as a finish (a worker cut off gives back this way). */
  handback(reason: string): void {
    this.sealed = true;
    if (this.muted) return;
    this.outbox.append(this.taskId, "handback", JSON.stringify({ reason }));
    this.kick();
  }

  private push(kind: "event" | "output" | "finish", body: Uint8Array | string, stream: Stream | null = null): void {
    if (this.muted || this.sealed) return;
    this.outbox.append(this.taskId, kind, body, stream);
    this.kick();
  }

  /** Send what the outbox holds for this task (also what an earlier run of this worker left there). */
  kick(): void {
    this.wanted = true;
    if (this.pumping) return;
    this.pumping = this.pump().finally(() => {
      this.pumping = null;
      if (this.wanted && !this.muted) this.kick();
    });
  }

  private async pump(): Promise<void> {
    while (!this.muted) {
      this.wanted = false;
      const items = this.outbox.batch(this.taskId, MAX_OUTPUT_POST, (byKindUntil.get(this.client) ?? 0) > Date.now() ? 0 : MAX_MIXED_REPORT);
      if (!items.length) return;
      const seq = items[0]!.seq;
      const last = items.at(-1)!.seq;
      const sent = await this.deliver(items, seq);
      if (sent) this.outbox.ack(this.taskId, last);
    }
  }

  private async deliver(items: OutboxItem[], seq: number): Promise<boolean> {
    const first = items[0]!;
    if (items.every((i) => sameRun(first, i))) return this.deliverRun(items, seq);
    const report: ReportsRequest = { seq, items: items.map(reportItem) };
    const sent = await this.send(`/v1/tasks/${this.taskId}/reports`, report, true);
    if (typeof sent === "boolean") return sent;
    // A server older than /reports: by kind, for a while. Refused (one item the server will not take): by kind this
    // once, so that item's run alone is refused, not the task's end with it.
    if (sent === "no route") byKindUntil.set(this.client, Date.now() + BY_KIND_MS);
    for (const run of runsOf(items, sameRun)) {
      if (!(await this.deliverRun(run, run[0]!.seq))) return false;
      // Each run acknowledged as it goes: a worker restarted midway does not send again what the server applied.
      this.outbox.ack(this.taskId, run.at(-1)!.seq);
    }
    return true;
  }

  /** Items of one kind (and stream), by the endpoints every server has. */
  private async deliverRun(items: OutboxItem[], seq: number): Promise<boolean> {
    const first = items[0]!;
    const path = `/v1/tasks/${this.taskId}`;
    if (first.kind === "finish" || first.kind === "handback") return this.send(`${path}/${first.kind}`, { ...JSON.parse(Buffer.from(first.body).toString()), seq });
    if (first.kind === "event") return this.send(`${path}/events`, { events: items.map((i) => JSON.parse(Buffer.from(i.body).toString())), seq });
    const lengths = items.map((i) => i.body.length).join(",");
    return this.send(`${path}/output?stream=${first.stream}&seq=${seq}&lengths=${lengths}`, Buffer.concat(items.map((i) => i.body)));
  }

  /**
   * POST, retried for as long as the network fails (the items wait on disk); the server's refusals are final.
   * `newRoute`: a server without the route says "no route" (an older one), and a refusal is the caller's to say.
   */
  async send(path: string, body: Record<string, unknown> | Uint8Array): Promise<boolean>;
  async send(path: string, body: Record<string, unknown> | Uint8Array, newRoute: true): Promise<boolean | "no route" | "refused">;
  async send(path: string, body: Record<string, unknown> | Uint8Array, newRoute = false): Promise<boolean | "no route" | "refused"> {
    let delay = 200;
    let told = false;
    for (;;) {
      try {
        await this.client.request("POST", path, body);
        if (told) this.log(`task ${this.taskId}: the server has it again`);
        return true;
      } catch (error) {
        // 502/503/504 from every replica: none can take it now, as when the network fails; the items wait on disk.
        if (error instanceof HttpError && !isUnavailable(error.status)) {
          if (newRoute && error.status === 404 && error.message.startsWith("no route ")) return "no route";
          if (newRoute && error.status !== 409 && error.status !== 401) return "refused";
          // 409: the server took the task back. 401: this worker's credential was replaced (it joined again); the agent deals with that.
          const revoked = error.status === 409 || error.status === 401;
          if (revoked && !this.muted) {
            this.revoke(error.message);
            return false;
          }
          // A refusal of this batch alone (a 400, a 413): said, and not sent again, so what follows still goes.
          if (!revoked) this.log(`task ${this.taskId}: the server refused ${path.split("/").pop()?.split("?")[0]}: ${error.message}`);
          return !revoked;
        }
        if (this.muted) return false;
        if (!told && delay >= 5000) {
          told = true;
          this.log(`task ${this.taskId}: the server does not answer (${(error as Error).message}); keeping its ${this.outbox.pending(this.taskId)} item(s) on disk and retrying`);
        }
        await sleep(delay);
        delay = Math.min(delay * 2, 5000);
      }
    }
  }

  /** The server no longer holds the task as this worker's (a refused report, or a beat's answer): nothing more is sent, what waits is dropped, the task is stopped. */
  revoke(message: string): void {
    if (this.muted) return;
    this.muted = true;
    this.outbox.drop(this.taskId);
    this.onRevoked(message);
  }

  /** Everything written so far has been delivered (or dropped). */
  async flush(): Promise<void> {
    while (this.pumping) await this.pumping;
  }
}

/** Items one request of their kind carries: the same kind, and output of the same stream. */
const sameRun = (a: OutboxItem, b: OutboxItem) => a.kind === b.kind && a.stream === b.stream;

/** An outbox item as `/reports` takes it (a handback never goes there: the outbox batches it alone). */
function reportItem(i: OutboxItem): ReportItemWire {
  if (i.kind === "event") return { event: JSON.parse(Buffer.from(i.body).toString()) };
  if (i.kind === "output") return { output: Buffer.from(i.body).toString("base64"), stream: i.stream! };
  return { finish: JSON.parse(Buffer.from(i.body).toString()) };
}
