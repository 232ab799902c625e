import type { ServerStore } from "./store.ts";

/** A look still under way after this long is taken for stuck (a connection gone half-open): the next one goes ahead. */
const STUCK_MS = 10_000;

/**
 * With replicas, a wake-up from another one (a NOTIFY) is lost while this
 * one's listening connection is down, so the long polls waiting here are
 * looked at again every `everyMs`: all of them together, in a statement or
 * two per 500 workers, and only those with news are woken. Each poll looking
 * on its own was two statements per worker a second (2,000 a second at 1,000
 * workers: most of the database's work for a fleet at rest).
 */
export class PollRecheck {
  /** Worker id → the credentials its waiting polls came with (a restarted worker's old poll may still wait beside its new one). */
  private readonly waiting = new Map<string, (string | null)[]>();
  private readonly timer: ReturnType<typeof setInterval>;
  /** When the look under way began (0: none): one at a time, but a look stuck on a dead connection does not stop the next for good. */
  private lookingSince = 0;

  constructor(
    private readonly store: ServerStore,
    private readonly wake: (workerId: string) => void,
    everyMs: number,
  ) {
    this.timer = setInterval(() => void this.look(), everyMs);
    this.timer.unref?.();
  }

  /** A poll of this worker waits here from now; the function returned says it has stopped waiting. */
  enter(workerId: string, secretHash: string | null): () => void {
    const list = this.waiting.get(workerId) ?? [];
    list.push(secretHash);
    this.waiting.set(workerId, list);
    let left = false;
    return () => {
      if (left) return;
      left = true;
      list.splice(list.indexOf(secretHash), 1);
      if (!list.length && this.waiting.get(workerId) === list) this.waiting.delete(workerId);
    };
  }

  private async look(): Promise<void> {
    const now = Date.now();
    if ((this.lookingSince && now - this.lookingSince < STUCK_MS) || !this.waiting.size) return;
    this.lookingSince = now;
    // As the polls wait now: one that ends while the look is under way leaves the map, not this copy.
    const waiting = new Map([...this.waiting].map(([id, secrets]) => [id, [...secrets]]));
    try {
      for (const id of await this.store.pollNews(waiting)) this.wake(id);
    } catch {
      // The database did not answer: the polls wait on (until a wake-up or their end), and the next look tries again.
    } finally {
      if (this.lookingSince === now) this.lookingSince = 0;
    }
  }

  close(): void {
    clearInterval(this.timer);
  }
}
