/**
 * Short JSON columns parsed once per text (a worker's free GPUs, read with
 * every worker on each dispatch pass). A row's column keeps its last text and
 * what it parsed to; the same text again gets the same value, frozen, because
 * reads share it. Long columns are not compared here on every read: see
 * worker-rows.ts.
 */

const MAX_SLOTS = 50_000;

export class ParsedOnce {
  private readonly last = new Map<string, { text: string; value: unknown }>();

  /** `slot` names the row and column ("w1:probe"); `text` is the column as read. */
  of<T>(slot: string, text: string): T {
    const kept = this.last.get(slot);
    if (kept && kept.text === text) return kept.value as T;
    const value = deepFreeze(JSON.parse(text));
    // Bounded: rows come and go over a server's life; a cleared map only parses again.
    if (this.last.size >= MAX_SLOTS) this.last.clear();
    this.last.set(slot, { text, value });
    return value as T;
  }
}

/** Frozen: every read of the value shares it. */
export function deepFreeze<T>(value: T): T {
  if (value && typeof value === "object" && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const v of Object.values(value)) deepFreeze(v);
  }
  return value;
}
