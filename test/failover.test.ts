import { afterAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { ClusterClient, connect, normalizeServerUrl, remoteTarget } from "../src/cluster/client.ts";
import { resolveSettings } from "../src/config/resolve.ts";
import { HttpError, UsageError, UserError } from "../src/errors.ts";
import { TaskChannel } from "../src/worker/channel.ts";
import { identityFile, saveIdentity } from "../src/worker/identity.ts";
import { Outbox } from "../src/worker/outbox.ts";
import { deadUrl, Replica } from "./fixtures/replica.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";
import { cli, sandbox, startCli } from "./helpers.ts";
import { homeLayout } from "../src/config/paths.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

/**
 * Clients and workers given several replicas of one server (`--server
 * a,b`, `gpulayer join a,b`): real HTTP to small replicas on 127.0.0.1
 * (test/fixtures/replica.ts), and real `gpulayer` processes. A replica that
 * cannot be reached, or answers 502/503/504, is passed over for the next;
 * the one that answered is asked first after.
 */

const TOKEN = "failover-replicas-token-0123456789";
const box = sandbox();
const replicas: Replica[] = [];
const procs: Kept[] = [];
afterAll(async () => {
  await stopAll(procs);
  for (const r of replicas) r.stop();
  box.cleanup();
});

const replica = (name: string) => {
  const r = new Replica(name);
  replicas.push(r);
  return r;
};
const thrown = async (p: Promise<unknown>): Promise<Error> => {
  try {
    await p;
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected a failure");
};

describe("a client of several replicas", () => {
  test("a dead first URL: the live one answers, and is asked first from then on", async () => {
    const live = replica("live");
    const dead = deadUrl();
    const client = new ClusterClient([dead, live.url], TOKEN);
    expect(await client.json<{ replica: string }>("GET", "/v1/health")).toEqual({ ok: true, replica: "live" } as never);
    expect(client.url).toBe(live.url);
    await client.json("GET", "/v1/health");
    expect(live.paths()).toEqual(["GET /v1/health", "GET /v1/health"]);
    expect(live.asked[0]!.auth).toBe(`Bearer ${TOKEN}`);
  });

  test("a comma-joined string works as a list", async () => {
    const live = replica("live");
    const client = new ClusterClient(`${deadUrl()},${live.url}`, TOKEN);
    expect(client.urls).toHaveLength(2);
    expect((await client.json<{ replica: string }>("GET", "/v1/health")).replica).toBe("live");
  });

  test("a replica answering 503 is skipped, and not asked again while the other answers", async () => {
    const [a, b] = [replica("a"), replica("b")];
    a.unavailable = true;
    const client = new ClusterClient([a.url, b.url], TOKEN);
    expect((await client.json<{ replica: string }>("GET", "/v1/health")).replica).toBe("b");
    expect((await client.json<{ replica: string }>("GET", "/v1/health")).replica).toBe("b");
    expect(a.asked).toHaveLength(1);
    expect(b.asked).toHaveLength(2);
  });

  test("replica A stopped mid-sequence: the next request goes to B, and stays there", async () => {
    const [a, b] = [replica("a"), replica("b")];
    const client = new ClusterClient([a.url, b.url], TOKEN);
    expect((await client.json<{ replica: string }>("GET", "/v1/health")).replica).toBe("a");
    a.stop();
    expect((await client.json<{ replica: string }>("GET", "/v1/health")).replica).toBe("b");
    expect((await client.json<{ replica: string }>("GET", "/v1/health")).replica).toBe("b");
    expect(b.asked).toHaveLength(2);
  });

  test("clients of one target share the replica that answers", async () => {
    const live = replica("live");
    const target = { url: "", urls: [deadUrl(), live.url], token: TOKEN, bundleLimits: { maxBytes: 1, maxUnpacked: 1 } as never, cancelGraceMs: 0 };
    await connect(target).json("GET", "/v1/health");
    expect(connect(target).url).toBe(live.url);
  });

  test("every replica down: one UserError naming all of them; a 503 among them makes it an HttpError 503", async () => {
    const [d1, d2] = [deadUrl(), deadUrl()];
    const error = await thrown(new ClusterClient([d1, d2], TOKEN).json("GET", "/v1/health"));
    expect(error).toBeInstanceOf(UserError);
    expect(error).not.toBeInstanceOf(HttpError);
    expect(error.message).toStartWith(`cannot reach the gpulayer server at any of ${d1}, ${d2}: ${d1}: `);
    expect(error.message).toContain(`; ${d2}: `);
    expect(error.message).not.toContain("\n");

    const busy = replica("busy");
    busy.unavailable = true;
    const mixed = await thrown(new ClusterClient([d1, busy.url], TOKEN).json("GET", "/v1/health"));
    expect(mixed).toBeInstanceOf(HttpError);
    expect((mixed as HttpError).status).toBe(503);
    expect(mixed.message).toContain(d1);
    expect(mixed.message).toContain(`${busy.url}: busy is unavailable`);

    // One URL: the message it always had.
    const single = await thrown(new ClusterClient(d1, TOKEN).json("GET", "/v1/health"));
    expect(single.message).toStartWith(`cannot reach the gpulayer server at ${d1}: `);
  });

  test("a request aborted by its caller is not sent to another replica", async () => {
    const [slow, other] = [replica("slow"), replica("other")];
    const client = new ClusterClient([slow.url, other.url], TOKEN);
    const abort = new AbortController();
    const asked = client.json("GET", "/v1/slow", undefined, { signal: abort.signal });
    await waitFor("the slow replica asked", () => slow.asked.length > 0);
    abort.abort();
    expect((await thrown(asked)).name).toBe("AbortError");
    expect((await thrown(client.json("GET", "/v1/health", undefined, { signal: AbortSignal.abort() }))).name).toBe("AbortError");
    expect(other.asked).toEqual([]);
    expect(client.url).toBe(slow.url);
  });

  test("a POST with a JSON body is sent again, the same body, to the next replica", async () => {
    const [a, b] = [replica("a"), replica("b")];
    a.unavailable = true;
    const body = { name: "x", nested: { list: [1, 2, 3], text: "é ✓" } };
    const r = await new ClusterClient([a.url, b.url], TOKEN).json<{ replica: string; body: unknown }>("POST", "/v1/echo", body);
    expect(r).toEqual({ replica: "b", body });
    expect(b.asked[0]!.body).toBe(a.asked[0]!.body);
  });

  test("a file (Blob) body is sent again; a stream body, which cannot be, is not", async () => {
    const [a, b] = [replica("a"), replica("b")];
    a.unavailable = true;
    const file = join(box.root, "artifact.bin");
    writeFileSync(file, "artifact bytes ".repeat(1000));
    const client = new ClusterClient([a.url, b.url], TOKEN);
    const r = await (await client.request("PUT", "/v1/bytes", Bun.file(file))).json();
    expect(r).toEqual({ replica: "b", bytes: 15_000, text: readFileSync(file, "utf8") });
    expect(a.asked[0]!.body).toBe(readFileSync(file, "utf8"));

    const dead = deadUrl();
    const stream = new Response("streamed").body!;
    const error = await thrown(new ClusterClient([dead, b.url], TOKEN).request("PUT", "/v1/bytes", stream));
    expect(error.message).toStartWith(`cannot reach the gpulayer server at ${dead}: `);
    expect(error.message).toContain("cannot be sent again");
    expect(b.asked).toHaveLength(1);
  });

  test("a long poll cut when its replica stops moves to the next", async () => {
    const [a, b] = [replica("a"), replica("b")];
    const client = new ClusterClient([a.url, b.url], TOKEN);
    const poll = client.json<{ replica: string }>("GET", "/v1/poll?wait=1");
    await waitFor("the poll at a", () => a.asked.length > 0);
    a.stop();
    expect((await poll).replica).toBe("b");
    expect(b.paths()).toEqual(["GET /v1/poll"]);
  });
});

test("a replica that takes the connection and never answers (frozen) is given the poll's wait and a margin, then the next one answers", async () => {
  // A listener that accepts and says nothing: a stopped (SIGSTOP) or frozen replica seen from outside.
  const frozen = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Promise<Response>(() => {}) });
  const b = replica("b");
  try {
    const client = new ClusterClient([`http://127.0.0.1:${frozen.port}`, b.url], TOKEN);
    client.replicas.answerMarginMs = 300;
    const t = performance.now();
    expect((await client.json<{ replica: string }>("GET", "/v1/poll?wait=0.2")).replica).toBe("b");
    // Not before the wait and the margin (0.5 s): a long poll is not mistaken for a frozen replica.
    expect(performance.now() - t).toBeGreaterThan(450);
    expect(client.url).toBe(b.url);
    // With one replica there is nowhere else to go: it is waited for, not given up on.
    const alone = new ClusterClient([`http://127.0.0.1:${frozen.port}`], TOKEN);
    alone.replicas.answerMarginMs = 100;
    const outcome = await Promise.race([alone.json("GET", "/v1/health").then(() => "answered", () => "failed"), Bun.sleep(600).then(() => "still waiting")]);
    expect(outcome).toBe("still waiting");
  } finally {
    void frozen.stop(true);
  }
});

describe("a task's reports", () => {
  test("502/503/504 from every replica is waited out, as network trouble is: the items stay on disk and go once one answers", async () => {
    const [a, b] = [replica("a"), replica("b")];
    a.unavailable = b.unavailable = true;
    const outbox = new Outbox(homeLayout(join(box.root, "outbox-home")));
    const logs: string[] = [];
    const channel = new TaskChannel(new ClusterClient([a.url, b.url], TOKEN), "t1", outbox, (m) => logs.push(`revoked: ${m}`), (m) => logs.push(m));
    channel.event("task.prepare.step", { step: "resolve", detail: "1" });
    await waitFor("both asked", () => a.asked.length > 0 && b.asked.length > 0);
    expect(outbox.pending("t1")).toBe(1);
    b.unavailable = false;
    await channel.flush();
    expect(outbox.pending("t1")).toBe(0);
    expect(b.paths().at(-1)).toBe("POST /v1/tasks/t1/events");
    expect(JSON.parse(b.asked.at(-1)!.body).events[0]).toMatchObject({ type: "task.prepare.step", data: { step: "resolve", detail: "1" } });
    expect(logs.filter((l) => l.includes("refused") || l.startsWith("revoked"))).toEqual([]);
    outbox.close();
  });
});

describe("the server setting: several URLs", () => {
  const env = (server: string) => ({ GPULAYER_HOME: box.home, GPULAYER_SERVER: server, GPULAYER_TOKEN: TOKEN });

  test("GPULAYER_SERVER=a,b parses to the normalized URLs joined with a comma", async () => {
    const r = await resolveSettings(env(" a.example:1 , https://b.example:2/api/ "));
    expect(r.values.server).toBe("http://a.example:1,https://b.example:2/api");
    const target = remoteTarget(r)!;
    expect(target.urls).toEqual(["http://a.example:1", "https://b.example:2/api"]);
    expect(target.url).toBe("http://a.example:1,https://b.example:2/api");
    // One URL as it always was.
    expect((await resolveSettings(env("a.example:1/"))).values.server).toBe("http://a.example:1");
  });

  test("a bad URL in the list is one line naming it; a duplicate or an empty entry is refused", async () => {
    const refused = async (server: string) => {
      const error = await (async () => {
        try {
          await resolveSettings(env(server));
        } catch (e) {
          return e as Error;
        }
        throw new Error(`${server} was taken`);
      })();
      expect(error).toBeInstanceOf(UsageError);
      expect(error.message).not.toContain("\n");
      return error.message;
    };
    expect(await refused("http://a.example:1,ftp://b.example")).toBe("GPULAYER_SERVER=http://a.example:1,ftp://b.example (environment): ftp://b.example: expected http:// or https://");
    expect(await refused("http://a.example:1,http://u:p@b.example")).toContain("http://u:p@b.example: put the token in --token or GPULAYER_TOKEN, not in the URL");
    expect(await refused("http://a.example:1,a.example:1/")).toEndWith(": http://a.example:1 is in the list twice");
    expect(await refused("http://a.example:1,,http://b.example")).toContain("an empty URL in the list");
    expect(await refused("http://a.example:1,")).toContain("an empty URL in the list");
    expect(() => normalizeServerUrl("http://a.example:1,ftp://b.example", "SERVER_URL")).toThrow("SERVER_URL http://a.example:1,ftp://b.example: ftp://b.example: expected http:// or https://");
    expect(normalizeServerUrl("b.example:2, a.example:1", "SERVER_URL")).toBe("http://b.example:2,http://a.example:1");
  });

  test("gpulayer workers with a dead URL first reaches the live one; all dead, one line naming both, exit 1; a bad list, exit 2", async () => {
    const live = replica("live");
    const dead = deadUrl();
    const ok = await cli(["workers", "--json"], { env: { ...box.env, GPULAYER_SERVER: `${dead},${live.url}`, GPULAYER_TOKEN: TOKEN } });
    expect(ok.code, ok.stderr).toBe(0);
    expect(JSON.parse(ok.stdout)).toEqual([]);
    expect(live.paths()).toEqual(["GET /v1/workers"]);

    const other = deadUrl();
    const down = await cli(["workers", "--server", `${dead},${other}`], { env: { ...box.env, GPULAYER_TOKEN: TOKEN } });
    expect(down.code).toBe(1);
    expect(down.stderr.trim().split("\n")).toHaveLength(1);
    expect(down.stderr).toContain(`cannot reach the gpulayer server at any of ${dead}, ${other}`);

    const bad = await cli(["workers", "--server", `${live.url},${live.url}/`], { env: { ...box.env, GPULAYER_TOKEN: TOKEN } });
    expect(bad.code).toBe(2);
    expect(bad.stderr.trim().split("\n")).toHaveLength(1);
    expect(bad.stderr).toContain(`${live.url} is in the list twice`);
  });
});

describe("a worker joined with several replicas", () => {
  const homeOf = (name: string) => join(box.root, `home-${name}`);
  const join_ = (name: string, servers: string) => {
    const env = { ...box.env, GPULAYER_HOME: homeOf(name), GPULAYER_TOKEN: TOKEN, GPULAYER_WORKER_ENGINE: "none", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
    return keepOutput(startCli(["join", servers, "--name", name, "--python", "python3"], { env }), procs);
  };
  const identities = (name: string) => readdirSync(join(homeOf(name), "cluster", "identity")).map((f) => JSON.parse(readFileSync(join(homeOf(name), "cluster", "identity", f), "utf8")));
  const [a, b] = [replica("a"), replica("b")];
  const dead = deadUrl();

  test("joins the first that answers, names it, and moves to the next when it stops; its identity is the whole list's", async () => {
    const w = join_("fw", `${dead},${a.url},${b.url}`);
    await waitFor("joined", () => w.out().includes(`joined ${a.url} (one of 3 replicas) as fw`));
    const [saved, ...more] = identities("fw");
    expect(more).toEqual([]);
    expect(saved).toMatchObject({ server: [dead, a.url, b.url].sort().join(","), name: "fw", id: "w1", credential: "gplw_a_1" });
    await waitFor("a heartbeat at a", () => a.paths().includes("POST /v1/workers/w1/heartbeat"));

    a.stop();
    await waitFor("the worker on b", () => w.out().includes(`the server at ${a.url} does not answer; now talking to ${b.url}`));
    // The same worker and credential: the replicas share one database.
    await waitFor("a heartbeat at b", () => b.asked.some((q) => q.path === "/v1/workers/w1/heartbeat" && q.auth === "Bearer gplw_a_1"));
    await waitFor("a poll at b", () => b.paths().includes("GET /v1/workers/w1/tasks"));
    w.proc.kill("SIGTERM");
    expect(await w.proc.exited).toBe(0);
    expect(b.paths()).toContain("POST /v1/workers/w1/leave");
    expect(w.out()).not.toContain("gplw_");
  });

  test("started again with the list in another order: the same worker", async () => {
    const w = join_("fw", `${b.url},${a.url},${dead}`);
    await waitFor("joined", () => w.out().includes(`joined ${b.url} (one of 3 replicas) as fw`));
    expect(b.registrations.at(-1)!.resume).toEqual({ id: "w1", credential: "gplw_a_1" });
    w.proc.kill("SIGTERM");
    expect(await w.proc.exited).toBe(0);
  });

  test("an identity saved under one URL of the list is found, and kept up to date", async () => {
    const layout = homeLayout(homeOf("fs"));
    const single = saveIdentity(layout, { server: b.url, name: "fs", id: "wsingle", credential: "gplw_single" });
    const w = join_("fs", `${dead},${b.url}`);
    await waitFor("joined", () => w.out().includes(`joined ${b.url} (one of 2 replicas) as fs again`));
    expect(b.registrations.at(-1)!.resume).toEqual({ id: "wsingle", credential: "gplw_single" });
    const now = JSON.parse(readFileSync(single, "utf8"));
    expect(now).toMatchObject({ server: b.url, id: "wsingle" });
    expect(now.credential).not.toBe("gplw_single");
    expect(existsSync(identityFile(layout, `${b.url},${dead}`, "fs"))).toBe(true);
    w.proc.kill("SIGTERM");
    expect(await w.proc.exited).toBe(0);
  });
});
