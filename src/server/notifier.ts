/**
 * Wake-ups by key: a long poll waits on its key until something happens or
 * time runs out. `longestWaitMs` bounds each wait: with replicas, a wake-up
 * from another one (NOTIFY) may be missed while its connection is down, and
 * the waiter then looks again on its own, unless something else looks for
 * it (`rechecked`: workers' polls, poll-recheck.ts).
 */
export class Notifier {
  private waiters = new Map<string, Set<() => void>>();
  private readonly hearers: ((key: string) => void)[] = [];
  constructor(private readonly longestWaitMs = Number.POSITIVE_INFINITY) {}
  /** Every key woken from now on is also told to `fn` (what is kept of a worker hears of it: credential-cache.ts). */
  hear(fn: (key: string) => void): void {
    this.hearers.push(fn);
  }
  wait(key: string, ms: number, signal?: AbortSignal, rechecked = false): Promise<void> {
    // Cut off already (while its caller looked): an abort listener added now would never fire.
    if (signal?.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      const set = this.waiters.get(key) ?? new Set();
      this.waiters.set(key, set);
      const done = () => {
        clearTimeout(timer);
        set.delete(done);
        if (!set.size) this.waiters.delete(key);
        signal?.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, rechecked ? ms : Math.min(ms, this.longestWaitMs));
      set.add(done);
      signal?.addEventListener("abort", done);
    });
  }
  wake(key: string): void {
    for (const fn of this.hearers) fn(key);
    for (const fn of [...(this.waiters.get(key) ?? [])]) fn();
  }
}
