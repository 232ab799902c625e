import type { TaskRow } from "./store.ts";

/**
 * The rules for what workers report, apart from the coordinator that applies
 * them: which items of a worker's outbox are new (each is applied once), and
 * which tasks a worker's beats no longer list (ended there unheard).
 */

/**
 * Items `seq`..`seq + count - 1` against the last one applied: how many at
 * the front were applied already (sent again after a lost answer), and the
 * new last applied. Without `seq` (an older worker): all are new.
 */
export function outboxSkip(appliedSeq: number, seq: number | undefined, count: number): { skip: number; applied: number } {
  if (seq === undefined) return { skip: 0, applied: appliedSeq };
  return { skip: Math.min(count, Math.max(0, appliedSeq - seq + 1)), applied: Math.max(appliedSeq, seq + count - 1) };
}

/** Tasks missing from their worker's beats: two beats in a row, after the worker had time to start them, and they are gone. */
export class BeatReconciler {
  private strikes = new Map<string, number>();

  /** Whether this beat leaves any of `active` unlisted that gone() would count against: without, gone() only forgets. */
  anyUnlisted(active: TaskRow[], listed: Set<string>, settledBefore: number): boolean {
    return active.some((t) => !listed.has(t.id) && t.delivered && t.updated <= settledBefore);
  }

  /** The tasks of `active` this beat shows ended unheard. `settledBefore`: a task changed later is too fresh to judge. */
  gone(active: TaskRow[], listed: Set<string>, settledBefore: number): TaskRow[] {
    const out: TaskRow[] = [];
    for (const t of active) {
      if (listed.has(t.id) || !t.delivered || t.updated > settledBefore) {
        this.strikes.delete(t.id);
        continue;
      }
      const n = (this.strikes.get(t.id) ?? 0) + 1;
      if (n < 2) this.strikes.set(t.id, n);
      else {
        this.strikes.delete(t.id);
        out.push(t);
      }
    }
    return out;
  }
}

/** Where a prepare task's steps are kept in the events table (its rows are by job, and a prepare has none). */
export const prepareSteps = (taskId: string) => `prepare:${taskId}`;
