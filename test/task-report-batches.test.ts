import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { join } from "node:path";
import { ClusterClient } from "../src/cluster/client.ts";
import type { PollResponse, RegisterResponse } from "../src/cluster/protocol.ts";
import { homeLayout } from "../src/config/paths.ts";
import { TaskChannel } from "../src/worker/channel.ts";
import { Outbox } from "../src/worker/outbox.ts";
import { Replica } from "./fixtures/replica.ts";
import { keepOutput, stopAll, waitFor, type Kept } from "./fixtures/processes.ts";
import { sandbox, startCli } from "./helpers.ts";
import { machineProbe, trueJob } from "./fixtures/fleet-rows.ts";

setDefaultTimeout(60_000);

/**
 * A short job's reports (worker/channel.ts): its first event goes at once,
 * and what piles up meanwhile (events, a line of output, its end) goes in one
 * request of several kinds (`POST /v1/tasks/ID/reports`) that the server
 * applies in one transaction, once however often it is sent; to a server
 * without that route (an older version) the same items go by kind.
 */

const TOKEN = "task-report-batches-0123456789";
const box = sandbox();
const procs: Kept[] = [];
let url = "";
afterAll(async () => {
  await stopAll(procs);
  box.cleanup();
});

/** A worker of its own (labelled with its name) and a job only it takes, handed to it. */
async function jobOnOwnWorker(name: string) {
  const admin = new ClusterClient(url, TOKEN);
  const joined = await admin.json<RegisterResponse>("POST", "/v1/workers/register", { name, labels: { for: name }, slots: 1, probe: machineProbe(name) });
  const worker = admin.withToken(joined.credential);
  const { id } = await admin.json<{ id: string }>("POST", "/v1/jobs", { spec: trueJob(name), bundle: null, labels: { for: name }, workdir: "/w" });
  const task = (await worker.json<PollResponse>("GET", `/v1/workers/${joined.id}/tasks?wait=5`)).tasks[0]!;
  return { admin, worker, id, task };
}

/** A short job's items, in the order the task runner writes them. */
function shortJob(channel: TaskChannel): void {
  channel.event("task.prepare.started", { image: null } as never);
  channel.event("task.prepare.finished", { seconds: 0.004, status: "reused", cache: "hit" } as never);
  channel.event("task.run.started", { pid: 4242, command: "true" } as never);
  channel.output(new TextEncoder().encode("ok\n"), "stdout");
  channel.event("task.run.finished", { exit_code: 0, seconds: 0.01 } as never);
  channel.finish({ state: "succeeded", exit_code: 0, error: null });
}

describe("a short job's reports to a server", () => {
  beforeAll(async () => {
    const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...box.env, GPULAYER_TOKEN: TOKEN } }), procs);
    url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;
  });

  test("go in two requests, the second of several kinds; the job ends succeeded with its events and output once each, sent again or not", async () => {
    const { admin, worker, id, task } = await jobOnOwnWorker("w1");
    // Every request the channel makes, by path.
    const sent: string[] = [];
    const counting = new Proxy(worker, { get: (w, k) => (k === "request" ? (method: string, path: string, body: unknown) => (sent.push(path.split("?")[0]!.split("/").pop()!), w.request(method as "POST", path, body as never)) : Reflect.get(w, k)) });
    const outbox = new Outbox(homeLayout(join(box.root, "worker-home")));
    const logs: string[] = [];
    const channel = new TaskChannel(counting, task.id, outbox, (m) => logs.push(`revoked: ${m}`), (m) => logs.push(m));
    shortJob(channel);
    await channel.flush();
    expect(sent).toEqual(["events", "reports"]);
    expect(outbox.pending(task.id)).toBe(0);
    expect(logs).toEqual([]);

    const status = await admin.json<{ state: string; exit_code: number | null; events: { type: string }[] }>("GET", `/v1/jobs/${id}`);
    expect([status.state, status.exit_code]).toEqual(["succeeded", 0]);
    const types = () => admin.json<{ events: { type: string }[] }>("GET", `/v1/jobs/${id}`).then((s) => s.events.map((e) => e.type).filter((t) => t.startsWith("task.")));
    expect(await types()).toEqual(["task.prepare.started", "task.prepare.finished", "task.run.started", "task.run.finished"]);
    const log = async () => new TextDecoder().decode(await (await fetch(`${url}/v1/jobs/${id}/log`, { headers: { authorization: `Bearer ${TOKEN}` } })).arrayBuffer());
    expect(await log()).toBe("ok\n");

    // The second request again, as a worker whose answer was lost sends it: acknowledged, nothing applied twice.
    const again = { seq: 2, items: [{ event: { ts: Date.now(), type: "task.prepare.finished", data: {} } }, { event: { ts: Date.now(), type: "task.run.started", data: {} } }, { output: Buffer.from("ok\n").toString("base64"), stream: "stdout" }, { event: { ts: Date.now(), type: "task.run.finished", data: { exit_code: 0 } } }, { finish: { state: "succeeded", exit_code: 0, error: null } }] };
    expect(await worker.json("POST", `/v1/tasks/${task.id}/reports`, again)).toEqual({ ok: true });
    expect(await types()).toEqual(["task.prepare.started", "task.prepare.finished", "task.run.started", "task.run.finished"]);
    expect(await log()).toBe("ok\n");
    outbox.close();
  });

  test("a batch sent again with more items after it (its answer was lost): only the new items are applied", async () => {
    const { admin, worker, id, task } = await jobOnOwnWorker("w3");
    const event = (type: string) => ({ event: { ts: Date.now(), type, data: {} } });
    const first = [event("task.prepare.started"), { output: Buffer.from("a\n").toString("base64"), stream: "stdout" }];
    await worker.json("POST", `/v1/tasks/${task.id}/reports`, { seq: 1, items: first });
    await worker.json("POST", `/v1/tasks/${task.id}/reports`, { seq: 1, items: [...first, event("task.run.started"), { output: Buffer.from("b\n").toString("base64"), stream: "stdout" }] });
    const status = await admin.json<{ state: string; events: { type: string }[] }>("GET", `/v1/jobs/${id}`);
    expect(status.events.map((e) => e.type).filter((t) => t.startsWith("task."))).toEqual(["task.prepare.started", "task.run.started"]);
    expect(status.state).toBe("running");
    const log = new TextDecoder().decode(await (await fetch(`${url}/v1/jobs/${id}/log`, { headers: { authorization: `Bearer ${TOKEN}` } })).arrayBuffer());
    expect(log).toBe("a\nb\n");
  });

  test("an item the server refuses in a batch of several kinds loses its own run only: the output and the end still arrive", async () => {
    const { admin, worker, id, task } = await jobOnOwnWorker("w4");
    const outbox = new Outbox(homeLayout(join(box.root, "refused-home")));
    const logs: string[] = [];
    const channel = new TaskChannel(worker, task.id, outbox, (m) => logs.push(`revoked: ${m}`), (m) => logs.push(m));
    channel.event("task.run.started", { pid: 1, command: "true" } as never);
    // An event of a name longer than any the server keeps (a worker of some other version, say): refused.
    channel.event("x".repeat(200) as never, {} as never);
    channel.output(new TextEncoder().encode("still here\n"), "stdout");
    channel.finish({ state: "succeeded", exit_code: 0, error: null });
    await channel.flush();
    expect(logs).toHaveLength(1);
    expect(logs[0]).toStartWith(`task ${task.id}: the server refused events: events.0.type`);
    const status = await admin.json<{ state: string; exit_code: number | null }>("GET", `/v1/jobs/${id}`);
    expect([status.state, status.exit_code]).toEqual(["succeeded", 0]);
    const log = new TextDecoder().decode(await (await fetch(`${url}/v1/jobs/${id}/log`, { headers: { authorization: `Bearer ${TOKEN}` } })).arrayBuffer());
    expect(log).toBe("still here\n");
    outbox.close();
  });

  test("a report whose end is not its last item, or whose output is not base64, is refused in one line", async () => {
    const { worker } = await jobOnOwnWorker("w2");
    const refused = (body: Record<string, unknown>) => worker.json("POST", "/v1/tasks/nosuchtask/reports", body).then(() => "", (e: Error) => e.message);
    expect(await refused({ seq: 1, items: [{ finish: { state: "succeeded", exit_code: 0, error: null } }, { event: { ts: 1, type: "x", data: {} } }] })).toContain("a finish only as the last item");
    expect(await refused({ seq: 1, items: [{ output: "not base64!", stream: "stdout" }] })).toBe('items.0.output: Invalid Base64: Received "not base64!"');
  });
});

test("to a server without /reports (an older version), the same items go by kind, numbered as before, and later batches too", async () => {
  const old = new Replica("old");
  try {
    const outbox = new Outbox(homeLayout(join(box.root, "old-home")));
    const client = new ClusterClient(old.url, TOKEN);
    const channel = new TaskChannel(client, "t1", outbox, () => {}, () => {});
    shortJob(channel);
    await channel.flush();
    expect(old.paths()).toEqual(["POST /v1/tasks/t1/events", "POST /v1/tasks/t1/reports", "POST /v1/tasks/t1/events", "POST /v1/tasks/t1/output", "POST /v1/tasks/t1/events", "POST /v1/tasks/t1/finish"]);
    const seqs = old.asked.map((a) => (a.path.endsWith("/output") ? null : JSON.parse(a.body).seq));
    expect(seqs).toEqual([1, 2, 2, null, 5, 6]);
    expect(outbox.pending("t1")).toBe(0);
    // Another task's reports through the same client: by kind at once, no /reports asked again.
    const next = new TaskChannel(client, "t2", outbox, () => {}, () => {});
    shortJob(next);
    await next.flush();
    expect(old.paths().slice(6).filter((p) => p.endsWith("/reports"))).toEqual([]);
    outbox.close();
  } finally {
    old.stop();
  }
});
