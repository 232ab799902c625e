import { hasRoom, type Load, type Needs, ranksBefore } from "./match.ts";
import type { WorkerRow } from "./store.ts";

/**
 * A dispatch pass's choice of worker for each job, as `chooseAmong` makes
 * it, without looking at every worker for every job: a pass of 700 queued
 * jobs over 1,000 workers asked `hasRoom` 700,000 times, a fifth of a busy
 * replica's CPU. The workers able to run one ask (the same needs) are kept
 * in a heap by rank, made once per ask and pass.
 *
 * Within a pass loads only grow (each choice adds one), so a worker's rank
 * only worsens and a worker without room for an ask stays so. The heap
 * therefore keeps each worker's rank as last seen and checks the top alone:
 * without room, it leaves for good; ranked worse than kept, it goes back
 * down with its rank as it is now; else it is the best of all, as
 * `chooseAmong` would have found.
 */
export class Placer {
  private readonly heaps = new Map<string, RankHeap>();
  constructor(private readonly loads: Map<string, Load>) {}

  /** The worker to take a job of these needs now (`key` names the needs; `able`, the workers that could ever run it), or null. */
  choose(needs: Needs, key: string, able: WorkerRow[]): WorkerRow | null {
    let heap = this.heaps.get(key);
    // Only workers with room now go in: one without room stays so for the pass, and one of no slots would rank as NaN.
    if (!heap) this.heaps.set(key, (heap = new RankHeap(able.filter((w) => hasRoom(needs, w, this.loads.get(w.id)!)).map((w) => this.ranked(w)))));
    for (;;) {
      const top = heap.top();
      if (!top) return null;
      const load = this.loads.get(top.worker.id)!;
      if (!hasRoom(needs, top.worker, load)) heap.pop();
      else if (load.running !== top.seen.running) heap.replaceTop(this.ranked(top.worker));
      else return top.worker;
    }
  }

  private ranked(worker: WorkerRow): Ranked {
    return { worker, seen: { running: this.loads.get(worker.id)!.running, usedGpus: NO_GPUS } };
  }
}

const NO_GPUS = new Set<number>();

/** A worker with its load as last seen (what ranks it is how many jobs it runs; its GPUs in use do not). */
interface Ranked {
  worker: WorkerRow;
  seen: Load;
}

const before = (a: Ranked, b: Ranked) => ranksBefore(a.worker, a.seen, b.worker, b.seen);

/** A binary min-heap of ranked workers. */
class RankHeap {
  constructor(private readonly items: Ranked[]) {
    for (let i = (items.length >> 1) - 1; i >= 0; i--) this.down(i);
  }

  top(): Ranked | undefined {
    return this.items[0];
  }

  pop(): void {
    const last = this.items.pop()!;
    if (this.items.length) {
      this.items[0] = last;
      this.down(0);
    }
  }

  /** The top, ranked again (only ever worse): it sinks to its place. */
  replaceTop(item: Ranked): void {
    this.items[0] = item;
    this.down(0);
  }

  private down(i: number): void {
    const { items } = this;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let least = i;
      if (l < items.length && before(items[l]!, items[least]!)) least = l;
      if (r < items.length && before(items[r]!, items[least]!)) least = r;
      if (least === i) return;
      [items[i], items[least]] = [items[least]!, items[i]!];
      i = least;
    }
  }
}
