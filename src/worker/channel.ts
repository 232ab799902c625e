import type { ClusterClient } from "../cluster/client.ts";
import { HttpError } from "../errors.ts";
import type { TaskEventIn } from "../cluster/protocol.ts";
import { sleep } from "../core/sleep.ts";

type Stream = "stdout" | "stderr";
type Item = { kind: "event"; event: TaskEventIn } | { kind: "output"; stream: Stream; data: Uint8Array };

const MAX_OUTPUT_POST = 1024 * 1024;

/**
 * A task's events and output on their way to the server, in the order they
 * happened: one request at a time, and whatever piled up meanwhile goes in the
 * next one (so a chatty job costs few requests, and a quiet one's first line
 * leaves at once). Network trouble is retried; a 409 means the server took the
 * task back (its worker was declared lost), and the task is stopped, as it is
 * on a 401 (the worker's credential was replaced).
 */
export class TaskChannel {
  private queue: Item[] = [];
  private pumping: Promise<void> | null = null;
  /** Nothing more is sent (the task was handed back or taken back). */
  muted = false;

  constructor(
    private readonly client: ClusterClient,
    private readonly taskId: string,
    private readonly onRevoked: (message: string) => void,
    private readonly log: (message: string) => void,
  ) {}

  event(type: string, data: Record<string, unknown>): void {
    this.push({ kind: "event", event: { ts: Date.now(), type, data } });
  }

  output(chunk: Uint8Array, stream: Stream): void {
    this.push({ kind: "output", stream, data: chunk.slice() });
  }

  private push(item: Item): void {
    if (this.muted) return;
    this.queue.push(item);
    this.kick();
  }

  private kick(): void {
    if (this.pumping) return;
    this.pumping = this.pump().finally(() => {
      this.pumping = null;
      if (this.queue.length && !this.muted) this.kick();
    });
  }

  private async pump(): Promise<void> {
    while (this.queue.length && !this.muted) {
      const first = this.queue[0]!;
      if (first.kind === "output") {
        const parts: Uint8Array[] = [];
        let size = 0;
        const same = (i: Item | undefined): i is Extract<Item, { kind: "output" }> => i?.kind === "output" && i.stream === first.stream;
        while (same(this.queue[0]) && size < MAX_OUTPUT_POST) {
          const item = this.queue.shift() as Extract<Item, { kind: "output" }>;
          parts.push(item.data);
          size += item.data.length;
        }
        await this.send(`/v1/tasks/${this.taskId}/output?stream=${first.stream}`, Buffer.concat(parts));
      } else {
        const events: TaskEventIn[] = [];
        while (this.queue[0]?.kind === "event") events.push((this.queue.shift() as Extract<Item, { kind: "event" }>).event);
        await this.send(`/v1/tasks/${this.taskId}/events`, { events });
      }
    }
  }

  /** POST with retries for up to a minute of network trouble; the server's refusals are final. */
  async send(path: string, body: Record<string, unknown> | Uint8Array): Promise<boolean> {
    let delay = 200;
    const deadline = Date.now() + 60_000;
    for (;;) {
      try {
        await this.client.request("POST", path, body);
        return true;
      } catch (error) {
        if (error instanceof HttpError) {
          // 409: the server took the task back. 401: this worker's credential was replaced (it joined again); the agent deals with that.
          const revoked = error.status === 409 || error.status === 401;
          if (revoked && !this.muted) {
            this.muted = true;
            this.queue = [];
            this.onRevoked(error.message);
          } else if (!revoked) this.log(`task ${this.taskId}: the server refused ${path.split("/").pop()}: ${error.message}`);
          return false;
        }
        if (Date.now() > deadline) {
          this.log(`task ${this.taskId}: giving up on ${path.split("/").pop()}: ${(error as Error).message}`);
          return false;
        }
        await sleep(delay);
        delay = Math.min(delay * 2, 5000);
      }
    }
  }

  /** Everything queued has been sent (or given up on). */
  async flush(): Promise<void> {
    while (this.pumping) await this.pumping;
  }
}
