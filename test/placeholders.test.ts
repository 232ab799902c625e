import { describe, expect, test } from "bun:test";
import { mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { MIRROR_MARK, type WorkerDist, writePlaceholders } from "../src/env/build/worker-mirror.ts";
import { tempDir } from "./helpers.ts";

/**
 * The placeholders a worker's first build writes (hundreds on a GPU box) go
 * through the thread pool: a worker that beats while it builds must not stall.
 * Written synchronously, 300 of them held a loaded worker's event loop for
 * seconds, no beat went out, and the server gave its job to another worker.
 */

function workerSite(count: number): { site: string; dists: WorkerDist[] } {
  const site = join(tempDir("gpl-placeholders-"), "site-packages");
  const dists: WorkerDist[] = [];
  for (let i = 0; i < count; i++) {
    const path = join(site, `pkg_${i}-1.${i}.dist-info`);
    mkdirSync(path, { recursive: true });
    writeFileSync(join(path, "METADATA"), `Metadata-Version: 2.1\nName: pkg-${i}\nVersion: 1.${i}\nRequires-Dist: pkg-${(i + 1) % count}\n`);
    dists.push({ name: `pkg-${i}`, version: `1.${i}`, path, kind: "dist-info" });
  }
  return { site, dists };
}

describe("the worker's placeholders", () => {
  test("300 are written while timers still run, each a copy of the worker's METADATA marked as ours and owned by this home", async () => {
    const { dists } = workerSite(300);
    const into = tempDir("gpl-placeholders-into-");
    let ticks = 0;
    const ticking = setInterval(() => ticks++, 0);
    let names: string[];
    try {
      names = await writePlaceholders(into, dists);
    } finally {
      clearInterval(ticking);
    }
    // A timer that fires during the writes: the event loop was free between them.
    expect(ticks).toBeGreaterThan(0);
    expect(readdirSync(into).sort()).toEqual([...names].sort());
    expect(names).toHaveLength(300);
    for (const [i, dist] of dists.entries()) {
      const dir = join(into, names[i]!);
      expect(names[i]).toBe(`pkg_${i}-1.${i}.dist-info`);
      expect(readFileSync(join(dir, "METADATA"), "utf8")).toBe(readFileSync(join(dist.path, "METADATA"), "utf8"));
      expect(readFileSync(join(dir, "INSTALLER"), "utf8")).toBe(`${MIRROR_MARK}\n`);
      expect(readFileSync(join(dir, "RECORD"), "utf8").trim().split("\n")).toEqual(["METADATA", "WHEEL", "INSTALLER", "RECORD"].map((f) => `${names[i]}/${f},,`));
      // Written, not copied: the worker's files are 0644, what gpulayer writes follows its umask.
      expect(statSync(join(dir, "METADATA")).mode & 0o777).toBe(0o666 & ~process.umask());
    }
  });

  test("a worker distribution that cannot be read fails the writes with its path, after the others have ended", async () => {
    const { dists } = workerSite(40);
    dists[7] = { ...dists[7]!, path: join(dists[7]!.path, "..", "gone-1.0.dist-info") };
    const into = tempDir("gpl-placeholders-into-");
    await expect(writePlaceholders(into, dists)).rejects.toThrow("gone-1.0.dist-info");
    // No write is still running once it has failed: the folder no longer changes.
    const seen = readdirSync(into).length;
    await Bun.sleep(50);
    expect(readdirSync(into).length).toBe(seen);
  });
});
