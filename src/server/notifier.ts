/** Wake-ups by key: a long poll waits on its key until something happens or time runs out. */
export class Notifier {
  private waiters = new Map<string, Set<() => void>>();
  wait(key: string, ms: number, signal?: AbortSignal): Promise<void> {
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
      const timer = setTimeout(done, ms);
      set.add(done);
      signal?.addEventListener("abort", done);
    });
  }
  wake(key: string): void {
    for (const fn of [...(this.waiters.get(key) ?? [])]) fn();
  }
}
