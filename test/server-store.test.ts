import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Database as Sqlite } from "bun:sqlite";
import { tempDir } from "./helpers.ts";
import { hasPostgres, type Postgres, startPostgres } from "./fixtures/postgres.ts";
import type { MachineProbe, RemoteSpec } from "../src/cluster/protocol.ts";
import { migrate, SCHEMA_VERSION } from "../src/server/db/migrations.ts";
import { PostgresDatabase } from "../src/server/db/postgres.ts";
import type { Database } from "../src/server/db/sql.ts";
import { SqliteDatabase } from "../src/server/db/sqlite.ts";
import { HeldSecrets, SecretSeal } from "../src/server/held-secrets.ts";
import { ServerStore } from "../src/server/store.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

/**
 * One suite for the server's store on both databases: SQLite in a folder,
 * and a real PostgreSQL (a throw-away cluster, fixtures/postgres.ts). What
 * a user of the server sees depends on these: ids found by prefix, output
 * read back at byte offsets, events in order, the writer lock serialising
 * replicas, credentials sealed, an old SQLite home migrated in place.
 */

const T = 60_000;
let pg: Postgres | null = null;
const root = tempDir();

beforeAll(async () => {
  if (hasPostgres) pg = await startPostgres();
}, T);
afterAll(async () => {
  await pg?.close();
  rmSync(root, { recursive: true, force: true });
});

let n = 0;
/** Where a new database is, and a connection to it (a second one to the same place plays another replica). */
interface Dialect {
  place(): Promise<string>;
  connect(place: string): Database;
}
type Open = () => Promise<Database>;
const dialects: [string, Dialect][] = [
  ["SQLite", { place: async () => join(root, `db-${++n}`, "server.db"), connect: (file) => new SqliteDatabase(file) }],
  ["PostgreSQL", { place: () => pg!.database(), connect: (url) => new PostgresDatabase(url) }],
];

const probe = (hostname: string): MachineProbe => ({ hostname, os: "linux", arch: "x64", cpus: 2, memoryBytes: 1, gpus: [], python: null, frameworks: {}, cuda: null, engine: null, probeMs: 1 });
const spec = (name: string, extra: Partial<RemoteSpec> = {}): RemoteSpec => ({ name, commandText: "true", environment: {}, resources: { gpus: 0, frameworks: {} }, ...extra }) as unknown as RemoteSpec;

async function opened(open: Open): Promise<{ db: Database; store: ServerStore; files: string }> {
  const db = await open();
  await migrate(db);
  const files = join(root, `files-${++n}`);
  mkdirSync(files, { recursive: true });
  return { db, store: new ServerStore(db, files), files };
}

for (const [name, dialect] of dialects) {
  let place = "";
  const open: Open = async () => dialect.connect((place = await dialect.place()));
  describe(`the server's store on ${name}`, () => {
    // PostgreSQL must be there in CI (.ci/run installs it); a machine without it runs the SQLite half.
    const it = name === "PostgreSQL" && !hasPostgres ? test.skip : test;

    it("migrates once: a second run changes nothing, the version is recorded", async () => {
      const db = await open();
      expect(await migrate(db)).toEqual({ from: 0, to: SCHEMA_VERSION });
      expect(await migrate(db)).toEqual({ from: SCHEMA_VERSION, to: SCHEMA_VERSION });
      expect((await db.all("SELECT version FROM schema_migrations ORDER BY version")).map((r) => Number(r.version))).toEqual(Array.from({ length: SCHEMA_VERSION }, (_, i) => i + 1));
      await db.close();
    });

    it("jobs: found by id and unique prefix, tasks in the job file's order, only dispatchable ones queued", async () => {
      const { db, store } = await opened(open);
      await store.addJob({ id: "aa11000000000001", name: "one", spec: spec("one"), bundle: null, labels: {}, workdir: "/w" });
      await store.addJob({ id: "aa12000000000002", name: "two", spec: spec("two"), bundle: null, labels: { gpu: "a100" }, workdir: "/w" });
      for (const t of ["zeta", "alpha", "mid"]) await store.addJob({ id: `bb00000000000${t === "zeta" ? "001" : t === "alpha" ? "002" : "003"}`, name: `p/${t}`, spec: spec(t), bundle: null, labels: {}, workdir: "/w", parentId: "aa12000000000002", task: t, needs: t === "mid" ? ["zeta"] : [] });
      expect((await store.jobsByPrefix("aa1")).length).toBe(2);
      expect((await store.jobsByPrefix("aa11")).map((j) => j.name)).toEqual(["one"]);
      // A task's row by its whole id only.
      expect((await store.jobsByPrefix("bb0")).length).toBe(0);
      expect((await store.jobsByPrefix("bb00000000000003"))[0]?.needs).toEqual(["zeta"]);
      expect((await store.tasksOf("aa12000000000002")).map((t) => t.task)).toEqual(["zeta", "alpha", "mid"]);
      expect((await store.job("aa12000000000002"))?.labels).toEqual({ gpu: "a100" });
      // The job of tasks is never queued itself; its tasks are.
      expect((await store.queuedJobs()).map((j) => j.id)).toEqual(["aa11000000000001", "bb00000000000001", "bb00000000000002", "bb00000000000003"]);
      await store.addWorker({ id: "w1", name: "w1", labels: {}, probe: probe("h1"), slots: 1, state: "idle", registered: 1, lastSeen: 2, joinedWith: null }, "secret-hash");
      await store.addTask({ id: "t1", kind: "job", jobId: "aa11000000000001", groupId: null, workerId: "w1", attempt: 1, gpus: [], prepare: null, bundle: null });
      expect((await store.queuedJobs()).map((j) => j.id)).not.toContain("aa11000000000001");
      await store.updateJob("aa11000000000001", { state: "failed", exitCode: 3, error: "boom" });
      const failed = (await store.job("aa11000000000001"))!;
      expect([failed.state, failed.exitCode, failed.error]).toEqual(["failed", 3, "boom"]);
      expect((await store.jobStateCounts()).get("queued")).toBe(4);
      expect((await store.jobs(10)).map((j) => j.name)).toEqual(["two", "one"]);
      await db.close();
    });

    it("output: read back at any byte offset, streams kept apart, a long log paged, a read cut to its limit", async () => {
      const { db, store } = await opened(open);
      await store.addJob({ id: "cc00000000000001", name: "log", spec: spec("log"), bundle: null, labels: {}, workdir: "/w" });
      const pieces: string[] = [];
      for (let i = 0; i < 150; i++) {
        const text = `line ${i}\n`;
        pieces.push(text);
        expect(await store.appendLog("cc00000000000001", new TextEncoder().encode(text), i % 3 === 0 ? 2 : 1)).toBe(pieces.join("").length);
      }
      const all = pieces.join("");
      expect(new TextDecoder().decode(await store.readLog("cc00000000000001", 0))).toBe(all);
      expect(new TextDecoder().decode(await store.readLog("cc00000000000001", 13))).toBe(all.slice(13));
      expect(new TextDecoder().decode(await store.readLog("cc00000000000001", 5, 20))).toBe(all.slice(5, 25));
      const chunks = await store.readChunks("cc00000000000001", 0);
      expect(chunks.filter((c) => c.stream === 2).length).toBe(50);
      expect((await store.job("cc00000000000001"))?.logSize).toBe(all.length);
      // Appends from many at once (workers through several replicas) never overlap.
      await Promise.all(Array.from({ length: 20 }, () => store.appendLog("cc00000000000001", new Uint8Array(7).fill(120))));
      expect((await store.readLog("cc00000000000001", all.length)).length).toBe(140);
      await db.close();
    });

    it("events: in the order they happened, read after a mark", async () => {
      const { db, store } = await opened(open);
      for (let i = 0; i < 5; i++) await store.relayedEvent("dd00000000000001", { type: `e.${i}`, data: { i, url: "https://alice:s3cr@t@host/simple" } });
      const events = await store.events("dd00000000000001");
      expect(events.map((e) => e.type)).toEqual(["e.0", "e.1", "e.2", "e.3", "e.4"]);
      expect(events.map((e) => e.seq)).toEqual([...events.map((e) => e.seq)].sort((a, b) => a - b));
      expect((await store.events("dd00000000000001", events[2]!.seq)).map((e) => e.type)).toEqual(["e.3", "e.4"]);
      // No credential reaches the database.
      expect(JSON.stringify(events)).not.toContain("s3cr");
      await db.close();
    });

    // SQLite has one writer at a time: its commits are in seq order by construction. PostgreSQL draws a seq at the insert and shows it at the commit.
    (name === "PostgreSQL" && hasPostgres ? test : test.skip)("a stream's events from two writers at once, followed with one mark: the later is never seen before the earlier", async () => {
      const { db, store } = await opened(open);
      const other = new ServerStore(dialect.connect(place), join(root, "other-steps"));
      const cases = [
        // A prepare's steps, from two tasks' reports through two replicas, read as their group's.
        { stream: "g1", first: (tx: ServerStore) => tx.relayedEvents("prepare:t1", [{ type: "task.prepare.step", data: { n: 1 } }], "g1"), second: (tx: ServerStore) => tx.relayedEvents("prepare:t2", [{ type: "task.prepare.step", data: { n: 2 } }], "g1"), ids: ["prepare:t1", "prepare:t2"] },
        // A job's own: the server's event (a worker lost) in one change, a worker's report in another.
        { stream: "ee00000000000001", first: (tx: ServerStore) => tx.event("ee00000000000001", "job.worker_lost", { worker: "w1", message: "lost" }), second: (tx: ServerStore) => tx.relayedEvent("ee00000000000001", { type: "task.run.started", data: { n: 2 } }), ids: ["ee00000000000001"] },
      ];
      for (const c of cases) {
        let release!: () => void;
        const held = new Promise<void>((resolve) => (release = resolve));
        let inserted!: () => void;
        const firstIn = new Promise<void>((resolve) => (inserted = resolve));
        // The first writer's transaction has its event in and is still open; the second's, on another replica, draws a later seq and commits.
        const first = store.transaction(async (tx) => {
          await c.first(tx);
          inserted();
          await held;
        });
        await firstIn;
        await other.transaction((tx) => c.second(tx));
        // A reader now would take the second's seq as its mark and pass over the first for good: it waits for the first instead.
        let read: number[] | null = null;
        const reading = store.followEvents(c.stream, c.ids, 0).then((events) => (read = events.map((e) => e.seq)));
        // The job's case waits past the reader's lock timeout (2 s): it asks again, and still sees nothing before the first commits.
        await Bun.sleep(c.stream === "g1" ? 300 : 2_500);
        expect(read).toBeNull();
        release();
        await Promise.all([first, reading]);
        expect(read).toHaveLength(2);
        const all = await store.followEvents(c.stream, c.ids, 0);
        expect(all.map((e) => e.type)).toEqual([c.stream === "g1" ? "task.prepare.step" : "job.worker_lost", c.stream === "g1" ? "task.prepare.step" : "task.run.started"]);
        // And read after the first's seq, the second alone.
        expect((await store.followEvents(c.stream, c.ids, all[0]!.seq)).map((e) => e.seq)).toEqual([all[1]!.seq]);
      }
      await (other.sql as Database).close();
      await db.close();
    });

    // PostgreSQL's alone, as the test above: SQLite's writers take no stream lock.
    (name === "PostgreSQL" && hasPostgres ? test : test.skip)("a follower queued for a job's events never sits between two changes that settle it", async () => {
      const { db, store } = await opened(open);
      // Its deadlock check would undo such a cycle after a second: here it would not, and the changes would hang.
      await db.run(`ALTER DATABASE ${new URL(place).pathname.slice(1)} SET deadlock_timeout = '60s'`);
      await (db as PostgresDatabase).close();
      const fresh = new ServerStore(dialect.connect(place), join(root, "settle"));
      const job = "ff00000000000001";
      await fresh.addJob({ id: job, name: "p", spec: spec("p"), bundle: null, labels: {}, workdir: "/w" });
      const gate = () => {
        let open!: () => void;
        return { done: new Promise<void>((resolve) => (open = resolve)), open: () => open() };
      };
      const rowHeld = gate();
      const eventIn = gate();
      const go = gate();
      // One change settles the job (its row, then a task's end in its events); another, a dispatch pass, wrote an event and then wants the row.
      let settled = false;
      const settling = fresh.transaction(async (tx) => {
        await tx.lockJob(job);
        rowHeld.open();
        await go.done;
        await tx.event(job, "task.finished", { task: "c3", state: "done", exit_code: 0 });
      }).then(() => (settled = true));
      await rowHeld.done;
      const passing = fresh.transaction(async (tx) => {
        await tx.event(job, "task.skipped", { task: "c2", because: "c1 failed" });
        eventIn.open();
        await tx.lockJob(job);
      });
      await eventIn.done;
      const following = fresh.followEvents(job, [job], 0);
      await Bun.sleep(200);
      go.open();
      // The settling change goes on at once. (In the cycle it would wait until the follower's own lock timeout, 2 s, gave way.)
      await Bun.sleep(1_000);
      expect(settled).toBe(true);
      const ended = await Promise.race([Promise.all([settling, passing, following]).then(() => "ended"), Bun.sleep(10_000).then(() => "stuck")]);
      expect(ended).toBe("ended");
      expect((await following).map((e) => e.type).sort()).toEqual(["task.finished", "task.skipped"]);
      await (fresh.sql as PostgresDatabase).close();
    }, 30_000);

    it("the writer lock: changes from many at once (replicas) apply one at a time, none lost", async () => {
      const { db, store } = await opened(open);
      // SQLite is one process's: its "other" is the same database. PostgreSQL's is a second pool, as another replica has.
      const other = name === "PostgreSQL" ? new ServerStore(dialect.connect(place), join(root, "other")) : store;
      await store.addWorker({ id: "w1", name: "w1", labels: {}, probe: probe("h1"), slots: 0, state: "idle", registered: 1, lastSeen: 1, joinedWith: null }, "h");
      // Read, wait, write: without the lock, increments would overwrite each other.
      const bump = (s: ServerStore) =>
        s.exclusive(async (tx) => {
          const w = (await tx.worker("w1"))!;
          await Bun.sleep(1);
          await tx.updateWorker("w1", { slots: w.slots + 1 });
        });
      await Promise.all(Array.from({ length: 30 }, (_, i) => bump(i % 2 ? other : store)));
      expect((await store.worker("w1"))!.slots).toBe(30);
      // A failed change leaves nothing behind.
      await expect(store.exclusive(async (tx) => {
        await tx.updateWorker("w1", { slots: 99 });
        throw new Error("no");
      })).rejects.toThrow("no");
      expect((await store.worker("w1"))!.slots).toBe(30);
      if (other !== store) await (other.sql as Database).close();
      await db.close();
    });

    it("bundles: there only with row and file; sweep keeps what live jobs use; tokens by hash, revoked at once", async () => {
      const { db, store, files } = await opened(open);
      const h = (c: string) => c.repeat(64);
      for (const c of ["a", "b"]) {
        writeFileSync(store.bundles.path(h(c)), c);
        await store.bundles.add(h(c), 1);
      }
      expect(await store.bundles.has(h("a"))).toBe(true);
      rmSync(store.bundles.path(h("b")));
      expect(await store.bundles.has(h("b"))).toBe(false);
      expect((await store.bundles.list()).map((b) => b.hash)).toEqual([h("a")]);
      await store.addJob({ id: "ee00000000000001", name: "uses a", spec: spec("x"), bundle: h("a"), labels: {}, workdir: "/w" });
      const swept = await store.exclusive((s) => s.bundles.sweep({ retentionMs: 0, maxBytes: 0 }));
      expect(swept.removed).toEqual([]);
      expect(existsSync(join(files, "bundles", `${h("a")}.tar.gz`))).toBe(true);

      const token = await store.tokens.create("alice", "user");
      expect((await store.tokens.authenticate(token))?.name).toBe("alice");
      expect((await store.tokens.list()).map((t) => [t.name, t.role])).toEqual([["alice", "user"]]);
      expect(await store.tokens.revoke("alice")).toBe(true);
      expect(await store.tokens.authenticate(token)).toBeNull();
      await db.close();
    });

    it("build claims: one holder at a time across replicas, given up on release, expiry, or the worker gone", async () => {
      const { db, store } = await opened(open);
      const key = "f".repeat(64);
      expect(await store.artifacts.claim(key, "/envs/x", { id: "w1", name: "w1" }, "t1", 60_000)).toEqual({ granted: true });
      expect(await store.artifacts.claim(key, "/envs/x", { id: "w2", name: "w2" }, "t2", 60_000)).toEqual({ granted: false, holder: "w1" });
      expect(await store.artifacts.claim(key, "/envs/other", { id: "w2", name: "w2" }, "t2", 60_000)).toEqual({ granted: true });
      expect(await store.artifacts.builder(key, "/envs/x")).toBe("w1");
      expect(await store.artifacts.claimOf(key, "/envs/x")).toEqual({ worker: "w1", workerId: "w1", taskId: "t1" });
      await store.artifacts.release(key, "/envs/x", "w2");
      expect(await store.artifacts.builder(key, "/envs/x")).toBe("w1");
      // A wheel's compile claim (its sdist and conditions) is one of its own, dropped with the worker's others.
      expect(await store.wheels.claim(key, key, { id: "w1", name: "w1" }, "t1", 60_000)).toEqual({ granted: true });
      expect(await store.wheels.claim(key, key, { id: "w2", name: "w2" }, "t2", 60_000)).toEqual({ granted: false, holder: "w1" });
      await store.claims.dropAllOf("w1");
      expect(await store.artifacts.builder(key, "/envs/x")).toBeNull();
      expect(await store.wheels.claimOf(key, key)).toBeNull();
      expect(await store.artifacts.claim(key, "/envs/x", { id: "w3", name: "w3" }, "t3", 60_000, Date.now() - 120_000)).toEqual({ granted: true });
      expect(await store.artifacts.claim(key, "/envs/x", { id: "w2", name: "w2" }, "t2", 60_000)).toEqual({ granted: true });
      await db.close();
    });

    it("credentials of a request: in memory for one server, sealed in the database for replicas, unreadable under another token", async () => {
      const { db, store } = await opened(open);
      const original = spec("x", { environment: { indexUrl: "https://alice:s3cr@t@host/simple" } } as never);
      const stored = JSON.parse(JSON.stringify(original).replace("alice:s3cr@t@", "***@")) as RemoteSpec;
      const memory = new HeldSecrets<RemoteSpec>("job", null);
      await memory.hold(store.sql, "j1", original);
      expect(await memory.resolve(store.sql, "j1", stored)).toEqual(original);
      expect(await new HeldSecrets<RemoteSpec>("job", null).resolve(store.sql, "j1", stored)).toBeNull();
      expect((await db.all("SELECT * FROM held_secrets")).length).toBe(0);

      const sealed = new HeldSecrets<RemoteSpec>("job", new SecretSeal("the-server-token-0123456789"));
      await sealed.hold(store.sql, "j2", original);
      const row = (await db.get<{ sealed: string }>("SELECT sealed FROM held_secrets WHERE id = 'job:j2'"))!;
      expect(row.sealed).not.toContain("s3cr");
      expect(Buffer.from(row.sealed, "base64").toString("latin1")).not.toContain("s3cr");
      // Another replica with the same token reads it; a wrong token does not.
      expect(await new HeldSecrets<RemoteSpec>("job", new SecretSeal("the-server-token-0123456789")).resolve(store.sql, "j2", stored)).toEqual(original);
      expect(await new HeldSecrets<RemoteSpec>("job", new SecretSeal("another-token-000000000000")).resolve(store.sql, "j2", stored)).toBeNull();
      await sealed.keepOnly(store.sql, async () => false);
      expect((await db.all("SELECT * FROM held_secrets")).length).toBe(0);
      await db.close();
    });
  });
}

test("a SQLite home made before the schema was versioned migrates in place, its jobs kept", async () => {
  const file = join(root, "old", "server.db");
  mkdirSync(join(root, "old"));
  const old = new Sqlite(file, { create: true });
  // The tables as the first servers made them: no version table, columns added later missing.
  old.exec(`CREATE TABLE workers (id TEXT PRIMARY KEY, name TEXT NOT NULL, secret TEXT NOT NULL UNIQUE, labels TEXT NOT NULL, probe TEXT NOT NULL, slots INTEGER NOT NULL, state TEXT NOT NULL, registered REAL NOT NULL, last_seen REAL NOT NULL, free_gpus TEXT NOT NULL DEFAULT '[]');
    CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, spec TEXT NOT NULL, bundle TEXT, labels TEXT NOT NULL, workdir TEXT NOT NULL, exit_code INTEGER, error TEXT, env_key TEXT, worker_id TEXT, attempts INTEGER NOT NULL DEFAULT 0, waiting TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0, log_size INTEGER NOT NULL DEFAULT 0);
    INSERT INTO jobs (id, name, state, created, updated, spec, labels, workdir) VALUES ('ff00000000000001', 'kept', 'succeeded', 1, 1, '{"name":"kept"}', '{}', '/w');`);
  old.close();
  const db = new SqliteDatabase(file);
  expect(await migrate(db)).toEqual({ from: 0, to: SCHEMA_VERSION });
  const store = new ServerStore(db, join(root, "old"));
  expect((await store.job("ff00000000000001"))?.name).toBe("kept");
  expect((await store.job("ff00000000000001"))?.parentId).toBeNull();
  await store.addJob({ id: "ff00000000000002", name: "new", spec: spec("new"), bundle: null, labels: {}, workdir: "/w", parentId: "ff00000000000001", task: "t", needs: [] });
  expect((await store.tasksOf("ff00000000000001")).map((t) => t.task)).toEqual(["t"]);
  await db.close();
});

test("a database newer than this gpulayer is refused, not written", async () => {
  const db = new SqliteDatabase(join(root, "newer", "server.db"));
  await migrate(db);
  await db.run("INSERT INTO schema_migrations (version, applied) VALUES (?, ?)", SCHEMA_VERSION + 5, 0);
  await expect(migrate(db)).rejects.toThrow(`has schema version ${SCHEMA_VERSION + 5}, newer than this gpulayer's ${SCHEMA_VERSION}`);
  await db.close();
});

describe("SQLite: a write from outside a transaction", () => {
  test("is never taken into a transaction that opens meanwhile, so that one's rollback does not take it", async () => {
    const db = new SqliteDatabase(join(tempDir("gpl-sqlite-"), "server", "db.sqlite"));
    try {
      await db.run("CREATE TABLE t (x INTEGER)");
      // Past a slice, so the write first gives the event loop a turn: the moment a transaction can open.
      await Bun.sleep(20);
      const write = db.run("INSERT INTO t VALUES (1)");
      const rolledBack = db.exclusive(async () => {
        await Bun.sleep(20);
        throw new Error("this transaction fails");
      });
      await Promise.all([write, rolledBack.catch(() => {})]);
      expect(await db.all("SELECT x FROM t")).toEqual([{ x: 1 }]);
    } finally {
      await db.close();
    }
  });
});
