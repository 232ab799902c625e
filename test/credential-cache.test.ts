import { describe, expect, test } from "bun:test";
import { CredentialCache } from "../src/server/credential-cache.ts";
import type { WorkerRow } from "../src/server/worker-rows.ts";

/**
 * What a server keeps of workers' credentials between their requests
 * (server/credential-cache.ts), on an injected clock: taken as found for a
 * few seconds, gone as soon as anything happens to the worker, and never
 * put back by a lookup that began before that.
 */

const worker = (id: string) => ({ id, name: `n-${id}` }) as WorkerRow;

describe("workers' credentials kept between requests", () => {
  test("found, kept for its time, then looked up again", () => {
    let now = 1_000;
    const cache = new CredentialCache(5_000, () => now);
    cache.put("h1", worker("w1"), cache.mark());
    expect(cache.get("h1")?.id).toBe("w1");
    now += 4_999;
    expect(cache.get("h1")?.id).toBe("w1");
    now += 1;
    expect(cache.get("h1")).toBeNull();
  });

  test("a worker's wake-up forgets its credentials, and no other worker's", () => {
    const cache = new CredentialCache(5_000);
    cache.put("h1", worker("w1"), cache.mark());
    cache.put("h1-old", worker("w1"), cache.mark());
    cache.put("h2", worker("w2"), cache.mark());
    cache.heard("job:w1");
    expect(cache.get("h1")?.id).toBe("w1");
    cache.heard("worker:w1");
    expect([cache.get("h1"), cache.get("h1-old"), cache.get("h2")?.id]).toEqual([null, null, "w2"]);
  });

  test("a lookup begun before the worker's wake-up does not put back what it read; one begun after does", () => {
    const cache = new CredentialCache(5_000);
    const before = cache.mark();
    cache.heard("worker:w1"); // e.g. it joined again: that lookup read the credential it replaced
    cache.put("old", worker("w1"), before);
    expect(cache.get("old")).toBeNull();
    // Another worker's news does not spoil a lookup of this one.
    const mine = cache.mark();
    cache.heard("worker:w2");
    cache.put("new", worker("w1"), mine);
    expect(cache.get("new")?.id).toBe("w1");
  });

  test("bounded: past its size, what it remembered of forgetting is let go without putting back what a lookup in flight read", () => {
    const cache = new CredentialCache(5_000, Date.now, 3);
    const inFlight = cache.mark();
    for (const id of ["a", "b", "c", "d"]) cache.heard(`worker:${id}`);
    cache.put("stale", worker("a"), inFlight);
    expect(cache.get("stale")).toBeNull();
    for (const h of ["1", "2", "3", "4"]) cache.put(h, worker(`x${h}`), cache.mark());
    expect(["1", "2", "3", "4"].filter((h) => cache.get(h))).toEqual(["4"]);
  });
});
