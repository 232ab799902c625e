import { afterAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tempDir } from "./helpers.ts";
import { hasPostgres, postgresForFile } from "./fixtures/postgres.ts";
import { machineProbe, trueJob } from "./fixtures/fleet-rows.ts";
import { contentHash as sha256 } from "../src/core/hashing.ts";
import { Coordinator } from "../src/server/coordinator.ts";
import { migrate } from "../src/server/db/migrations.ts";
import { PostgresDatabase } from "../src/server/db/postgres.ts";
import { SqliteDatabase } from "../src/server/db/sqlite.ts";
import type { Database } from "../src/server/db/sql.ts";
import { JobsApi } from "../src/server/jobs-api.ts";
import { ServerStore } from "../src/server/store.ts";

setDefaultTimeout(120_000);

/**
 * Dispatch on a large fleet (coordinator.ts, worker-rows.ts): what a queued
 * job says it waits for stays one short line however many workers are busy,
 * and is written once, not on every pass; a worker's labels changed through
 * one replica are what another replica's next pass matches against, though
 * that replica read the worker before (it keeps workers' heavy columns
 * between passes, by their rev).
 */

const pg = postgresForFile();
const root = tempDir();
afterAll(() => rmSync(root, { recursive: true, force: true }));
const probe = machineProbe;
const spec = trueJob;

type Place = () => Promise<Database[]>;
let n = 0;
const stores: [string, Place][] = [
  [
    "SQLite",
    async () => {
      const file = join(root, `db-${++n}`, "server.db");
      mkdirSync(join(root, `db-${n}`), { recursive: true });
      return [new SqliteDatabase(file), new SqliteDatabase(file)];
    },
  ],
  [
    "PostgreSQL",
    async () => {
      const url = await pg()!.database();
      return [new PostgresDatabase(url), new PostgresDatabase(url)];
    },
  ],
];

async function replicas(place: Place): Promise<{ a: Coordinator; b: Coordinator; close(): Promise<void> }> {
  const dbs = await place();
  await migrate(dbs[0]!);
  const files = join(root, crypto.randomUUID());
  mkdirSync(files, { recursive: true });
  const opts = { heartbeatSeconds: 2, lostSeconds: 30, leaseSeconds: 60, maxAttempts: 3 };
  const [a, b] = dbs.map((db) => new Coordinator(new ServerStore(db, files), opts)) as [Coordinator, Coordinator];
  return {
    a,
    b,
    close: async () => {
      a.close();
      b.close();
      for (const db of dbs) await db.close();
    },
  };
}

/** Three idle workers, joined through `c`. */
async function threeJoined(c: Coordinator) {
  const joined = [];
  for (let i = 0; i < 3; i++) joined.push(await c.register({ name: `w${i}`, labels: {}, slots: 1, probe: probe(`host-${i}`) }));
  return joined;
}

/** A job submitted through `c`: the worker it was handed to. */
async function handOne(c: Coordinator): Promise<string> {
  const { id } = await new JobsApi(c).submit({ spec: spec("handed"), bundle: null, labels: {}, workdir: "/w" });
  return (await c.store.job(id))!.workerId!;
}

for (const [label, place] of stores) {
  // PostgreSQL is skipped only on a machine without it; CI requires it (GPULAYER_TEST_REQUIRE_POSTGRES).
  describe.skipIf(label === "PostgreSQL" && !hasPostgres)(`dispatch on a large fleet (${label})`, () => {
    test("a job queued behind 200 busy workers waits for one short line naming three of them, written once however many passes run", async () => {
      const { a, close } = await replicas(place);
      try {
        for (let i = 0; i < 200; i++) await a.register({ name: `w${String(i).padStart(3, "0")}`, labels: {}, slots: 1, probe: probe(`host-${i}`) });
        const api = new JobsApi(a);
        for (let i = 0; i < 200; i++) await api.submit({ spec: spec(`busy-${i}`), bundle: null, labels: {}, workdir: "/w" });
        const { id } = await api.submit({ spec: spec("queued"), bundle: null, labels: {}, workdir: "/w" });
        // More passes: each submit runs one, and the queued job's line is judged again in each.
        for (let i = 0; i < 3; i++) await api.submit({ spec: spec(`later-${i}`), bundle: null, labels: {}, workdir: "/w" });
        const job = (await a.store.job(id))!;
        expect(job.state).toBe("queued");
        expect(job.waiting).toBe("room on a worker (w000, w001, w002 and 197 more: its slot is busy)");
        const waited = (await a.store.events(id)).filter((e) => e.type === "job.waiting");
        expect(waited.map((e) => e.data.for)).toEqual([job.waiting]);
      } finally {
        await close();
      }
    });

    test("a fleet change that gives 300 queued jobs a new line rewrites them all, a bounded number per pass", async () => {
      const { a, close } = await replicas(place);
      try {
        await a.register({ name: "w0", labels: {}, slots: 1, probe: probe("host-0") });
        const api = new JobsApi(a);
        for (let i = 0; i < 301; i++) await api.submit({ spec: spec(`job-${i}`), bundle: null, labels: {}, workdir: "/w" });
        // A second worker joins: one job goes to it, and every other queued job waits on both now.
        await a.register({ name: "w1", labels: {}, slots: 1, probe: probe("host-1") });
        const lines = async () => (await a.store.queuedJobs()).filter((j) => !j.workerId).map((j) => j.waiting);
        for (let tries = 0; tries < 100 && (await lines()).some((l) => l !== "room on a worker (w0, w1: its slot is busy)"); tries++) await Bun.sleep(50);
        expect(new Set(await lines())).toEqual(new Set(["room on a worker (w0, w1: its slot is busy)"]));
        expect(await lines()).toHaveLength(299);
      } finally {
        await close();
      }
    });

    test("waiting polls looked at all together: woken are the worker handed a task and the one whose credential was replaced, not the others", async () => {
      const { a, b, close } = await replicas(place);
      try {
        const joined = await threeJoined(a);
        const waiting = new Map(joined.map((w) => [w.id, [sha256(w.credential)]]));
        expect(await b.store.pollNews(waiting)).toEqual([]);
        const holder = await handOne(a);
        expect(await b.store.pollNews(waiting)).toEqual([holder]);
        // Another worker restarted and joined again (a new credential): its old poll is to be told so (401).
        const other = joined.find((w) => w.id !== holder)!;
        await a.store.updateWorker(other.id, { lastSeen: 0 });
        await a.register({ name: other.name, labels: {}, slots: 1, probe: probe("host-x"), resume: { id: other.id, credential: other.credential } });
        expect(new Set(await b.store.pollNews(waiting))).toEqual(new Set([holder, other.id]));
      } finally {
        await close();
      }
    });

    test("a poll that ends while the look is under way costs the other polls nothing: the worker handed a task is still woken", async () => {
      const { a, b, close } = await replicas(place);
      try {
        const joined = await threeJoined(a);
        const waiting = new Map(joined.map((w) => [w.id, [sha256(w.credential)]]));
        const holder = await handOne(a);
        const look = b.store.pollNews(waiting);
        waiting.delete(joined.find((w) => w.id !== holder)!.id); // its only poll answered, cut off or timed out meanwhile
        expect(await look).toEqual([holder]);
      } finally {
        await close();
      }
    });

    test("a poll cut off while it looks ends at once, not at its deadline", async () => {
      const { a, close } = await replicas(place);
      try {
        const w = await a.register({ name: "w0", labels: {}, slots: 1, probe: probe("host-0") });
        const row = (await a.store.worker(w.id))!;
        const cut = new AbortController();
        // The worker's connection goes while the poll's first look is in the database.
        const look = a.poll(row, 6_000, cut.signal, sha256(w.credential));
        cut.abort();
        const started = Date.now();
        expect(await look).toEqual({ tasks: [], cancel: [] });
        expect(Date.now() - started).toBeLessThan(1_500);
      } finally {
        await close();
      }
    });

    test("a request whose credential was replaced before its change ran gets nothing done: a leave, a beat, a poll", async () => {
      const { a, b, close } = await replicas(place);
      try {
        const first = await a.register({ name: "w0", labels: {}, slots: 1, probe: probe("host-0") });
        // As replica b authenticated the old process's request a moment ago (or kept it: credential-cache.ts).
        const old = { ...(await b.store.worker(first.id))!, presented: sha256(first.credential) };
        await a.store.updateWorker(first.id, { lastSeen: 0 });
        await a.register({ name: "w0", labels: {}, slots: 1, probe: probe("host-0"), resume: { id: first.id, credential: first.credential } });
        await expect(b.leave(old, true)).rejects.toThrow("unauthorized");
        await expect(b.heartbeat(old, { running: [], free_gpus: [7] })).rejects.toThrow("unauthorized");
        await expect(b.poll(old, 100, undefined, old.presented)).rejects.toThrow("unauthorized");
        const now = (await a.store.worker(first.id))!;
        expect([now.state, now.freeGpus]).toEqual(["idle", []]);
      } finally {
        await close();
      }
    });

    test("a worker back with other labels through one replica is matched by them in the other replica's next pass", async () => {
      const { a, b, close } = await replicas(place);
      try {
        const joined = await a.register({ name: "w0", labels: { pool: "old" }, slots: 1, probe: probe("host-0") });
        // Replica b reads the worker (its labels too): a job for a pool it does not have is refused.
        const ask = { spec: spec("new-pool"), bundle: null, labels: { pool: "new" }, workdir: "/w" };
        await expect(new JobsApi(b).submit(ask)).rejects.toThrow("no worker can run it: w0: label pool=old, not new");
        const before = await b.store.workers({ present: true });
        expect(before.map((w) => w.labels)).toEqual([{ pool: "old" }]);
        // The same worker comes back (its process restarted) with the new label, through replica a.
        await a.store.updateWorker(joined.id, { lastSeen: 0 });
        const back = await a.register({ name: "w0", labels: { pool: "new" }, slots: 1, probe: probe("host-0"), resume: { id: joined.id, credential: joined.credential } });
        expect(back.id).toBe(joined.id);
        const submitted = await new JobsApi(b).submit(ask);
        const job = (await b.store.job(submitted.id))!;
        expect(job.workerId).toBe(joined.id);
        expect((await b.store.workers({ present: true })).map((w) => w.labels)).toEqual([{ pool: "new" }]);
      } finally {
        await close();
      }
    });
  });
}
