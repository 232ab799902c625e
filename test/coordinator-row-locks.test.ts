import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { tempDir } from "./helpers.ts";
import { hasPostgres, type Postgres, startPostgres } from "./fixtures/postgres.ts";
import type { RemoteSpec } from "../src/cluster/protocol.ts";
import { machineProbe, trueJob } from "./fixtures/fleet-rows.ts";
import { Coordinator } from "../src/server/coordinator.ts";
import { migrate } from "../src/server/db/migrations.ts";
import { PostgresDatabase } from "../src/server/db/postgres.ts";
import { JobsApi } from "../src/server/jobs-api.ts";
import { ServerStore, type WorkerRow } from "../src/server/store.ts";

setDefaultTimeout(120_000);

/**
 * Task reports, polls and submits take row locks, not the writer lock
 * (coordinator.ts): two replicas on one PostgreSQL apply them side by side.
 * What must still hold, whatever the interleaving: a job of tasks settles
 * once from all its tasks' ends, however many finish at the same moment;
 * each job is handed out once; no worker gets more than its slots.
 */

let pg: Postgres | null = null;
const root = tempDir();
beforeAll(async () => {
  // CI installs PostgreSQL; a machine without it cannot have a replica.
  if (hasPostgres) pg = await startPostgres();
}, 60_000);
afterAll(async () => {
  await pg?.close();
  rmSync(root, { recursive: true, force: true });
});

const probe = machineProbe;
const travelling = trueJob;
/** A plain job (`travelling(name)`) submitted through one replica. */
const submitTo = (replica: Coordinator, name: string) => new JobsApi(replica).submit({ spec: travelling(name) as unknown as RemoteSpec, bundle: null, labels: {}, workdir: "/w" });

/** Replicas (a coordinator each, its own pool) on one fresh database: two unless told. */
async function replicas(n = 2): Promise<{ a: Coordinator; b: Coordinator; all: Coordinator[]; close(): Promise<void> }> {
  const url = await pg!.database();
  const files = join(root, crypto.randomUUID());
  mkdirSync(files, { recursive: true });
  const dbs = Array.from({ length: n }, () => new PostgresDatabase(url));
  await migrate(dbs[0]!);
  const opts = { heartbeatSeconds: 2, lostSeconds: 30, leaseSeconds: 60, maxAttempts: 3 };
  const all = dbs.map((db) => new Coordinator(new ServerStore(db, files), opts));
  return {
    a: all[0]!,
    b: all[1]!,
    all,
    close: async () => {
      for (const c of all) c.close();
      for (const db of dbs) await db.close();
    },
  };
}

async function join_(c: Coordinator, n: number, slots = 1): Promise<WorkerRow[]> {
  const rows: WorkerRow[] = [];
  for (let i = 0; i < n; i++) {
    const r = await c.register({ name: `w${i}`, labels: {}, slots, probe: probe(`host-${i}`) });
    rows.push((await c.store.worker(r.id))!);
  }
  return rows;
}

// Row locks are PostgreSQL's alone (SQLite has one writer): skipped only on a machine without PostgreSQL, which CI requires (GPULAYER_TEST_REQUIRE_POSTGRES).
describe.skipIf(!hasPostgres)("row-locked changes on two replicas", () => {
  test("twelve tasks of one job finishing at the same moment through two replicas settle the job once: each task's end told once, the job succeeded", async () => {
    const { a, b, close } = await replicas();
    try {
      const workers = await join_(a, 12);
      const names = Array.from({ length: 12 }, (_, i) => `t${i}`);
      const spec = { ...travelling("wide"), tasks: names.map((name) => ({ name, needs: [], spec: travelling(name) })) } as unknown as RemoteSpec;
      const { id } = await new JobsApi(a).submit({ spec, bundle: null, labels: {}, workdir: "/w" });
      // Each worker polls for its task, then all report their ends at once, half through each replica.
      const held = await Promise.all(workers.map(async (w, i) => ({ w, i, tasks: (await (i % 2 ? b : a).poll(w, 0)).tasks })));
      expect(held.flatMap((h) => h.tasks)).toHaveLength(12);
      await Promise.all(held.flatMap(({ w, i, tasks }) => tasks.map((t) => (i % 2 ? b : a).taskFinish(w, t.id, { state: "succeeded", exit_code: 0, error: null, seq: 1 }))));
      const job = (await a.store.job(id))!;
      expect(job.state).toBe("succeeded");
      const events = await a.store.events(id);
      const told = events.filter((e) => e.type === "task.finished").map((e) => e.data.task as string);
      expect(told.sort()).toEqual([...names].sort());
      expect(events.filter((e) => e.type === "job.finished")).toHaveLength(1);
    } finally {
      await close();
    }
  });

  test("a task failing while its sibling succeeds, through two replicas: what needs the failed one is skipped, and the job ends failed (the skip's settle and the sibling's both lock the job)", async () => {
    const { a, b, close } = await replicas();
    try {
      const workers = await join_(a, 2);
      const task = (name: string, needs: string[] = []) => ({ name, needs, spec: travelling(name) });
      const spec = { ...travelling("failing"), tasks: [task("breaks"), task("aside"), task("after", ["breaks"]), task("last", ["after"])] } as unknown as RemoteSpec;
      // One job a round, its two ends at the same moment: "breaks" fails through one replica (whose dispatch pass then skips what needs it), "aside" succeeds through the other.
      for (let round = 0; round < 20; round++) {
        const { id } = await new JobsApi(a).submit({ spec, bundle: null, labels: {}, workdir: "/w" });
        const held = (await Promise.all(workers.map(async (w) => ({ w, tasks: (await a.poll(w, 0)).tasks })))).flatMap(({ w, tasks }) => tasks.map((t) => ({ w, t })));
        const names = new Map(await Promise.all(held.map(async ({ t }) => [t.id, (await a.store.job(t.job_id!))!.task!] as const)));
        await Promise.all(
          held.map(({ w, t }) =>
            names.get(t.id) === "breaks" ? a.taskFinish(w, t.id, { state: "failed", exit_code: 5, error: null, seq: 1 }) : b.taskFinish(w, t.id, { state: "succeeded", exit_code: 0, error: null, seq: 1 }),
          ),
        );
        const tasks = (await a.store.tasksOf(id)).map((t) => [t.task, t.state]).sort();
        expect(tasks).toEqual([["after", "skipped"], ["aside", "succeeded"], ["breaks", "failed"], ["last", "skipped"]]);
        expect([(await a.store.job(id))!.state, (await a.store.events(id)).filter((e) => e.type === "job.finished").length]).toEqual(["failed", 1]);
      }
    } finally {
      await close();
    }
  });

  test("a cancel through one replica as the job's end arrives through the other: the end its worker reported stands, never overwritten with cancelled", async () => {
    const { a, b, close } = await replicas();
    try {
      const [w] = await join_(a, 1);
      for (let round = 0; round < 20; round++) {
        const { id } = await submitTo(a, `j${round}`);
        const [t] = (await a.poll(w!, 0)).tasks;
        // The cancel either lands first (the worker is told, and its report still decides) or finds the job ended (409).
        const cancelled = new JobsApi(b).cancel(id).catch((e: Error) => e.message);
        await a.taskFinish(w!, t!.id, { state: "succeeded", exit_code: 0, error: null, seq: 1 });
        const answer = await cancelled;
        const job = (await a.store.job(id))!;
        expect([job.state, job.exitCode, (await a.store.events(id)).some((e) => e.type === "job.cancelled")]).toEqual(["succeeded", 0, false]);
        if (typeof answer === "string") expect(answer).toBe(`job ${id} has already ended (succeeded)`);
      }
    } finally {
      await close();
    }
  });

  test("a cancel through one replica as the other's dispatch pass hands the job out: the worker is told to stop it, never left running a job that says cancelled", async () => {
    const { a, b, close } = await replicas();
    try {
      const [w] = await join_(a, 1);
      for (let round = 0; round < 20; round++) {
        const first = await submitTo(a, `first${round}`);
        const [running] = (await a.poll(w!, 0)).tasks;
        const { id } = await submitTo(a, `next${round}`);
        // The first's end frees the slot (a's pass hands the next one out) as b cancels the next one.
        await Promise.all([a.taskFinish(w!, running!.id, { state: "succeeded", exit_code: 0, error: null, seq: 1 }), new JobsApi(b).cancel(id)]);
        const job = (await a.store.job(id))!;
        const task = await a.store.activeTaskOfJob(id);
        expect({ state: job.state, handedOut: Boolean(task), told: task?.cancel ?? null }).toEqual(task ? { state: "queued", handedOut: true, told: true } : { state: "cancelled", handedOut: false, told: null });
        // The worker stops what it was handed, and the job ends cancelled either way.
        for (const t of (await a.poll(w!, 0)).tasks) await a.taskFinish(w!, t.id, { state: "cancelled", exit_code: 130, error: null, seq: 1 });
        expect([(await a.store.job(id))!.state, (await a.store.job(first.id))!.state]).toEqual(["cancelled", "succeeded"]);
      }
    } finally {
      await close();
    }
  });

  test("a worker leaving as another replica's pass gives it work waits for that pass, and hands back what it was given: the job is queued again, not left on a worker that is gone", async () => {
    const { a, b, close } = await replicas();
    try {
      const [w] = await join_(a, 1);
      const { id } = await submitTo(a, "given");
      // Taken back to the queue, then given out again by a pass that holds the worker (as dispatch claims it) while the worker leaves through the other replica.
      const [first] = (await a.poll(w!, 0)).tasks;
      await a.store.transaction(async (s) => {
        await s.updateTask(first!.id, { state: "handed_back" });
        await s.updateJob(id, { workerId: null });
      });
      let left = false;
      await a.store.transaction(async (pass) => {
        expect((await pass.claimWorkers([w!.id])).map((x) => x.id)).toEqual([w!.id]);
        void b.leave(w!, true).then(() => (left = true));
        await Bun.sleep(300);
        expect(left).toBe(false);
        await pass.addTask({ id: "given-again", kind: "job", jobId: id, groupId: null, workerId: w!.id, attempt: 2, gpus: [], prepare: null, bundle: null });
        await pass.updateJob(id, { attempts: 2, workerId: w!.id });
      });
      for (let i = 0; i < 50 && !left; i++) await Bun.sleep(50);
      expect(left).toBe(true);
      expect([(await a.store.task("given-again"))!.state, (await a.store.job(id))!.state, (await a.store.job(id))!.workerId]).toEqual(["handed_back", "queued", null]);
    } finally {
      await close();
    }
  });

  test("forty jobs submitted at once through two replicas to ten one-slot workers: each handed out once, no worker over its slot, every job run in the end", async () => {
    const { a, b, close } = await replicas();
    try {
      const workers = await join_(a, 10);
      const ids = (await Promise.all(Array.from({ length: 40 }, (_, k) => submitTo(k % 2 ? b : a, `j${k}`)))).map((r) => r.id);
      const ran = new Map<string, number>();
      // Rounds: every worker polls (through either replica), checks it holds at most one task, finishes what it holds.
      for (let round = 0; round < 40 && [...ran.values()].length < 40; round++) {
        await Promise.all(
          workers.map(async (w, i) => {
            const c = (i + round) % 2 ? b : a;
            const { tasks } = await c.poll(w, 0);
            expect(tasks.length).toBeLessThanOrEqual(1);
            for (const t of tasks) {
              ran.set(t.job_id!, (ran.get(t.job_id!) ?? 0) + 1);
              await c.taskFinish(w, t.id, { state: "succeeded", exit_code: 0, error: null, seq: 1 });
            }
          }),
        );
        expect((await a.store.activeTasks()).length).toBeLessThanOrEqual(10);
      }
      expect([...ran.keys()].sort()).toEqual([...ids].sort());
      expect([...ran.values()].every((n) => n === 1)).toBe(true);
      for (const id of ids) expect((await a.store.job(id))!.state).toBe("succeeded");
    } finally {
      await close();
    }
  });

  test("three replicas dispatching at once (row locks, SKIP LOCKED): 120 jobs to eight two-slot workers, each handed out once, no worker ever over its slots", async () => {
    const { all, close } = await replicas(3);
    try {
      const workers = await join_(all[0]!, 8, 2);
      // Submitted through all three at once: each replica's dispatch passes run beside the others'.
      const ids = (await Promise.all(Array.from({ length: 120 }, (_, k) => submitTo(all[k % 3]!, `j${k}`)))).map((r) => r.id);
      const ran = new Map<string, number>();
      for (let round = 0; round < 200 && ran.size < 120; round++) {
        const perWorker = new Map<string, number>();
        for (const t of await all[0]!.store.activeTasks()) perWorker.set(t.workerId, (perWorker.get(t.workerId) ?? 0) + 1);
        expect(Math.max(0, ...perWorker.values())).toBeLessThanOrEqual(2);
        await Promise.all(
          workers.map(async (w, i) => {
            const { tasks } = await all[(i + round) % 3]!.poll(w, 0);
            for (const t of tasks) ran.set(t.job_id!, (ran.get(t.job_id!) ?? 0) + 1);
            // Each finish through another replica than the poll's: its dispatch pass runs there.
            await Promise.all(tasks.map((t) => all[(i + round + 1) % 3]!.taskFinish(w, t.id, { state: "succeeded", exit_code: 0, error: null, seq: 1 })));
          }),
        );
      }
      expect([...ran.keys()].sort()).toEqual([...ids].sort());
      expect([...ran.values()].filter((n) => n !== 1)).toEqual([]);
      for (const id of ids) expect((await all[0]!.store.job(id))!.attempts).toBe(1);
    } finally {
      await close();
    }
  });
});
