/**
 * Run `work` for every item, at most `width` at a time, and wait for all:
 * many small file writes through the thread pool instead of one blocking
 * call after another (a process that beats must keep its event loop free).
 * The first failure is thrown once all started work has ended.
 */
export async function eachAtMost<T>(items: readonly T[], width: number, work: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  let failure: { error: unknown } | null = null;
  const lane = async () => {
    while (next < items.length && !failure) {
      const item = items[next++]!;
      try {
        await work(item);
      } catch (error) {
        failure ??= { error };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(width, items.length) }, lane));
  if (failure) throw (failure as { error: unknown }).error;
}
