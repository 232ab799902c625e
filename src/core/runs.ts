/**
 * Consecutive items that belong together, as runs, in order: a worker's
 * outbox items by kind (and stream), each run one request or one write.
 */
export function runsOf<T>(items: readonly T[], together: (a: T, b: T) => boolean): T[][] {
  const runs: T[][] = [];
  for (const item of items) {
    const last = runs.at(-1);
    if (last && together(last[0]!, item)) last.push(item);
    else runs.push([item]);
  }
  return runs;
}
