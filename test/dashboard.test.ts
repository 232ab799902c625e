import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Browser, CHROMIUM } from "./fixtures/browser.ts";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, run, sandbox, startCli, tempDir } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * The dashboard and /metrics of a real server with a real worker, seen
 * through a real headless Chromium (its cookies, redirects, CSP and script),
 * and checked by Prometheus' own promtool. Screenshots of each page are kept
 * in GPULAYER_TEST_SCREENSHOTS (default: a temporary folder, printed).
 */

const TOKEN = "dashboard-test-token-0123456789";
const METRICS_TOKEN = "metrics-only-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "3", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "2", GPULAYER_WORKER_DRAIN_SECONDS: "2" };
const T = 120_000;
const boxes = { server: sandbox(), worker: sandbox(), client: sandbox() };
const index = new PackageIndex(join(boxes.client.root, "index"));
const procs: { proc: ReturnType<typeof startCli>; out: () => string }[] = [];
const shots = process.env.GPULAYER_TEST_SCREENSHOTS ?? tempDir("gpl-dashboard-shots-");
const PROMTOOL = Bun.which("promtool");
let url = "";
let browser: Browser | null = null;
/** The job named with markup, and a job still running (its log growing). */
let hostileJob = "";
let workerMetricsUrl = "";

const gpl = (args: string[], cwd?: string) => cli(args, { env: { ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: cwd ?? boxes.client.root });
const HOSTILE = "<script>alert(1)</script>";

beforeAll(async () => {
  index.start();
  index.wheel({ name: "greet", version: "1.0" });
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...boxes.server.env, ...FAST, GPULAYER_METRICS_TOKEN: METRICS_TOKEN } }), procs);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;
  const venv = await makeWorkerVenv(join(boxes.worker.root, "venv"), { env: boxes.worker.env });
  const worker = keepOutput(startCli(["join", url, "--name", "gpu-box-1", "--label", `team=${HOSTILE}`, "--python", venv, "--metrics-listen", "127.0.0.1:0"], { env: { ...boxes.worker.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), procs);
  workerMetricsUrl = (await waitFor("the worker's metrics", async () => /metrics at (http:\S+)/.exec(worker.out())?.[1])) as string;
  await waitFor("the worker", async () => (JSON.parse((await gpl(["workers", "--json"])).stdout) as unknown[]).length === 1);
  const dir = join(boxes.client.root, "hostile");
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "job.yaml"), `name: "${HOSTILE}"\ncommand: echo '<b>bold</b> & <img src=x onerror=alert(2)>'\nenvironment:\n  requirements: [greet]\n  index_url: ${index.url}\n`);
  const r = await gpl(["job", "run", "-f", "job.yaml", "--json"], dir);
  if (r.code !== 0) throw new Error(r.stderr);
  hostileJob = (JSON.parse(r.stdout) as { id: string }).id;
  if (CHROMIUM) browser = await Browser.launch();
  console.log(`dashboard screenshots: ${shots}`);
}, T);

afterAll(async () => {
  await browser?.close();
  await stopAll(procs);
  index.stop();
  for (const b of Object.values(boxes)) b.cleanup();
}, 30_000);

const path = async () => new URL(await browser!.eval<string>("location.href")).pathname;
const shoot = async (name: string) => {
  mkdirSync(shots, { recursive: true });
  writeFileSync(join(shots, `${name}.png`), await browser!.screenshot());
};

describe("without a session", () => {
  test("every page redirects to sign-in, every asset and live read answers 401; the API and /metrics want their token", async () => {
    for (const p of ["/", "/jobs", "/workers", "/envs", `/jobs/${hostileJob}`]) {
      const r = await fetch(`${url}${p}`, { redirect: "manual" });
      expect({ p, status: r.status, to: r.headers.get("location") }).toEqual({ p, status: 303, to: p === "/" ? "/login" : "/login" });
    }
    for (const p of ["/assets/app.js", "/assets/style.css", `/dash/api/jobs/${hostileJob}/log`]) expect((await fetch(`${url}${p}`)).status).toBe(401);
    // A session cookie that no sign-in made is no session.
    expect((await fetch(`${url}/jobs`, { redirect: "manual", headers: { cookie: `gpulayer_session=${"a".repeat(64)}` } })).status).toBe(303);
    expect((await fetch(`${url}/metrics`)).status).toBe(401);
    expect((await fetch(`${url}/v1/jobs`)).status).toBe(401);
  });

  test("sign-in: a wrong token is refused; a post from another site is refused; the cookie is HttpOnly, SameSite=Strict, Secure over https; the token is in no URL", async () => {
    const post = (token: string, headers: Record<string, string> = {}) => fetch(`${url}/login`, { method: "POST", redirect: "manual", body: new URLSearchParams({ token }), headers: { "content-type": "application/x-www-form-urlencoded", ...headers } });
    expect((await post("not-the-token")).status).toBe(401);
    expect((await post(TOKEN, { origin: "http://evil.example" })).status).toBe(403);
    const ok = await post(TOKEN, { origin: url });
    expect(ok.status).toBe(303);
    expect(ok.headers.get("location")).toBe("/jobs");
    const cookie = ok.headers.get("set-cookie")!;
    expect(cookie).toMatch(/^gpulayer_session=[0-9a-f]{64}; Path=\/; HttpOnly; SameSite=Strict; Max-Age=\d+$/);
    expect(cookie).not.toContain(TOKEN);
    const https = await post(TOKEN, { "x-forwarded-proto": "https" });
    expect(https.headers.get("set-cookie")).toEndWith("; Secure");
    // A join token signs nobody in.
    const join = JSON.parse((await cli(["server", "token", "create", "--role", "join", "--name", "j1", "--json"], { env: boxes.server.env })).stdout) as { token: string };
    expect((await post(join.token)).status).toBe(401);
    // The page sends its security headers.
    const page = await fetch(`${url}/jobs`, { headers: { cookie: cookie.split(";")[0]! } });
    expect(page.status).toBe(200);
    expect(page.headers.get("content-security-policy")).toContain("script-src 'self'");
    expect(page.headers.get("x-content-type-options")).toBe("nosniff");
    // Signing out from another site is refused too.
    expect((await fetch(`${url}/logout`, { method: "POST", redirect: "manual", headers: { cookie: cookie.split(";")[0]!, origin: "http://evil.example" } })).status).toBe(403);
  });
});

describe("sessions and edges", () => {
  const signIn = async (token: string) => {
    const r = await fetch(`${url}/login`, { method: "POST", redirect: "manual", body: new URLSearchParams({ token }), headers: { "content-type": "application/x-www-form-urlencoded" } });
    return (r.headers.get("set-cookie") ?? "").split(";")[0]!;
  };

  test("a session made with a user token ends when that token is revoked", async () => {
    // Tokens are made and revoked on the server's own machine (its home), as an admin does.
    const admin = (args: string[]) => cli(["server", "token", ...args], { env: boxes.server.env });
    const made = JSON.parse((await admin(["create", "--role", "user", "--name", "dash-user", "--json"])).stdout) as { token: string };
    const cookie = await signIn(made.token);
    expect((await fetch(`${url}/jobs`, { redirect: "manual", headers: { cookie } })).status).toBe(200);
    expect((await admin(["revoke", "dash-user"])).code).toBe(0);
    const after = await fetch(`${url}/jobs`, { redirect: "manual", headers: { cookie } });
    expect({ status: after.status, to: after.headers.get("location") }).toEqual({ status: 303, to: "/login" });
  });

  test("every answer outside the API has the security headers; HEAD answers as GET without a body; a live read's offset is clamped to the log", async () => {
    const denied = await fetch(`${url}/metrics`);
    expect(denied.status).toBe(401);
    expect(denied.headers.get("content-security-policy")).toContain("default-src 'none'");
    const head = await fetch(`${url}/metrics`, { method: "HEAD", headers: { authorization: `Bearer ${TOKEN}` } });
    expect({ status: head.status, body: await head.text() }).toEqual({ status: 200, body: "" });
    const cookie = await signIn(TOKEN);
    for (const offset of ["Infinity", "1e20", "-5", "abc"]) {
      const r = await fetch(`${url}/dash/api/jobs/${hostileJob}/log?offset=${offset}`, { headers: { cookie } });
      const size = Number(r.headers.get("x-gpulayer-log-size"));
      // The log is one short line: whatever was asked, the size told back is where the log really ends.
      expect({ offset, size }).toEqual({ offset, size: offset === "-5" ? (await r.text()).length : Buffer.byteLength("<b>bold</b> & <img src=x onerror=alert(2)>\n") });
    }
  });
});

// Skipped only where no chromium is installed: .ci/run installs Debian's, so CI runs it.
describe.skipIf(!CHROMIUM)("in a browser", () => {
  test("sign in with the token, then see the jobs with their prepare and run bars; markup in names and output shows as text", async () => {
    const b = browser!;
    await b.goto(`${url}/jobs`);
    expect(await path()).toBe("/login");
    // Styled, though the stylesheet file needs a session: its own copy, allowed by the CSP's hash.
    expect(await b.eval<string>(`getComputedStyle(document.querySelector("form.signin")).backgroundColor`)).toBe("rgb(255, 255, 255)");
    await shoot("sign-in");
    const loaded = b.once("Page.loadEventFired");
    await b.eval(`(document.getElementById("token").value = ${JSON.stringify(TOKEN)}, document.querySelector("form.signin").submit(), true)`);
    await loaded;
    expect(await path()).toBe("/jobs");
    const row = await b.eval<string>(`document.querySelector("tbody tr").textContent`);
    expect(row).toContain(HOSTILE); // shown as text...
    expect(await b.eval<number>(`document.querySelectorAll("script").length`)).toBe(1); // ...never run: the one script is the dashboard's
    expect(await b.eval<string>(`document.querySelector("script").getAttribute("src")`)).toBe("/assets/app.js");
    expect(await b.eval<number>(`Number(document.querySelector("svg.bar rect.prepare").getAttribute("width"))`)).toBeGreaterThan(0);
    expect(await b.eval<number>(`Number(document.querySelector("svg.bar rect.run").getAttribute("width"))`)).toBeGreaterThan(0);
    expect(row).toContain("succeeded");
    await shoot("jobs");
  }, T);

  test("a job's page: its phases on a timeline, its events, and its log, escaped", async () => {
    const b = browser!;
    await b.goto(`${url}/jobs/${hostileJob}`);
    expect(await b.eval<string>(`document.getElementById("log").textContent`)).toBe("<b>bold</b> & <img src=x onerror=alert(2)>\n");
    expect(await b.eval<number>(`document.querySelectorAll("#log *").length`)).toBe(0);
    expect(await b.eval<number>(`document.querySelectorAll("img").length`)).toBe(0);
    const labels = await b.eval<string[]>(`[...document.querySelectorAll("svg.timeline text")].map((t) => t.textContent)`);
    expect(labels[0]).toMatch(/^env built \(cache miss\)$/);
    expect(labels.some((l) => l === "run (exit 0)")).toBe(true);
    expect(await b.eval<string>(`document.body.textContent`)).toContain("task.prepare.finished");
    await shoot("job");
  }, T);

  test("a running job's log grows on its page as it runs, and the page shows its end", async () => {
    const b = browser!;
    const started = await gpl(["job", "run", "--detach", "--json", "--", "sh", "-c", "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.5; done"]);
    const { id } = JSON.parse(started.stdout) as { id: string };
    await waitFor("the job to run", async () => (JSON.parse((await gpl(["job", "status", id, "--json"])).stdout) as { state: string }).state === "running");
    await b.goto(`${url}/jobs/${id}`);
    expect(await b.eval<string>(`document.body.dataset.live`)).toBe("1");
    await b.waitFor(`document.getElementById("log").textContent.includes("line 3")`);
    await shoot("job-running");
    await b.waitFor(`document.getElementById("log") && document.getElementById("log").textContent.includes("line 6") && document.getElementById("job-state").textContent === "succeeded"`, 30_000);
  }, T);

  test("the workers page shows the worker, its labels as text, its load and cache; the environments page what it holds", async () => {
    const b = browser!;
    await waitFor("the worker's cache report", async () => {
      await b.goto(`${url}/workers`);
      return (await b.eval<string>(`document.querySelector("tbody").textContent`)).includes("env(s)");
    });
    const text = await b.eval<string>(`document.querySelector("tbody").textContent`);
    expect(text).toContain("gpu-box-1");
    expect(text).toContain(`team=${HOSTILE}`);
    expect(await b.eval<number>(`document.querySelectorAll("script").length`)).toBe(1);
    await shoot("workers");
    await b.goto(`${url}/envs`);
    expect(await b.eval<string>(`document.querySelector("main").textContent`)).toContain("greet");
    // Which interpreter each env was built for: a column of its own, version then path.
    expect(await b.eval<string[]>(`[...document.querySelectorAll("main thead th")].map((th) => th.textContent)`)).toEqual(["Key", "Python", "Request", "Size", "Last used", "State"]);
    // greet's env (other envs of the file's jobs may sort before it: ties in last use).
    const greetRow = await b.eval<string[] | null>(`(() => { const tr = [...document.querySelectorAll("main tbody tr")].find((r) => r.children[2]?.textContent.includes("greet")); return tr ? [...tr.children].map((td) => td.textContent) : null; })()`);
    expect(greetRow?.[1]).toMatch(/^3\.\d+\.\d+ \S*venv/);
    await shoot("envs");
    // Filtering the jobs by state.
    await b.goto(`${url}/jobs?state=failed`);
    expect(await b.eval<string>(`document.querySelector("tbody").textContent`)).toContain("No jobs match");
  }, T);

  test("the hit rate counts the env prepares a worker ran (env prepare --server) as well as jobs' prepares", async () => {
    const b = browser!;
    const hitRate = async () => {
      await b.goto(`${url}/workers`);
      return b.eval<string>(`document.querySelector("tbody tr td:nth-child(9)").textContent`);
    };
    const before = /^(\d+)% of (\d+)$/.exec(await hitRate());
    expect(before).not.toBeNull();
    // greet's env is there already (the jobs above built it): a hit.
    const r = await gpl(["env", "prepare", "-p", "greet", "--index-url", index.url, "--json"]);
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout).workers[0].status).toBe("reused");
    const after = /^(\d+)% of (\d+)$/.exec(await hitRate())!;
    expect(Number(after[2])).toBe(Number(before![2]) + 1);
    expect(Number(after[1])).toBeGreaterThanOrEqual(Number(before![1]));
  }, T);
});

describe("/metrics", () => {
  const scrape = async (token = METRICS_TOKEN) => {
    const r = await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${token}` } });
    expect(r.status).toBe(200);
    return r.text();
  };
  const value = (text: string, series: string) => Number(new RegExp(`^${series.replace(/[{}"]/g, (c) => `\\${c}`)} (\\S+)$`, "m").exec(text)?.[1] ?? "NaN");

  // Skipped only where promtool is missing: .ci/run installs Debian's prometheus, so CI runs it.
  test.skipIf(!PROMTOOL)("passes promtool check metrics", async () => {
    const file = join(boxes.client.root, "metrics.txt");
    writeFileSync(file, await scrape());
    const r = await run(["sh", "-c", `promtool check metrics < ${file}`]);
    expect({ code: r.code, out: r.stdout + r.stderr }).toEqual({ code: 0, out: "" });
  });

  test("its counters and histograms move as jobs run; the metrics token, the server's and a user token read it", async () => {
    const before = await scrape();
    const done = value(before, 'gpulayer_jobs_finished_total{state="succeeded"}');
    const prepared = value(before, 'gpulayer_task_prepare_seconds_count{cache="hit",kind="env"}') || 0;
    const r = await gpl(["job", "run", "--json", "-p", "greet", "--index-url", index.url, "--", "true"]);
    expect(r.code).toBe(0);
    const after = await scrape(TOKEN);
    // At least this job (another test's may have ended meanwhile).
    expect(value(after, 'gpulayer_jobs_finished_total{state="succeeded"}')).toBeGreaterThanOrEqual(done + 1);
    expect(value(after, 'gpulayer_task_prepare_seconds_count{cache="hit",kind="env"}')).toBeGreaterThanOrEqual(prepared + 1);
    expect(value(after, 'gpulayer_workers{state="idle"}') + value(after, 'gpulayer_workers{state="busy"}')).toBe(1);
    expect(after).toMatch(/^gpulayer_worker_cache_hit_ratio\{worker="gpu-box-1"\} 0\.\d+$/m);
    expect(after).toMatch(/^gpulayer_dispatch_latency_seconds_count \d+$/m);
    expect((await fetch(`${url}/metrics`, { headers: { authorization: "Bearer wrong-token-0123456789" } })).status).toBe(401);
  });

  test("a worker serves its own on request (join --metrics-listen): its slots, load, connection and cache", async () => {
    const text = await waitFor("a connected worker's metrics", async () => {
      const t = await (await fetch(workerMetricsUrl)).text();
      return /gpulayer_worker_connected\{worker="gpu-box-1"\} 1/.test(t) && /gpulayer_worker_cache_entries\{worker="gpu-box-1"\} [1-9]/.test(t) ? t : null;
    });
    expect(text).toMatch(/^gpulayer_worker_slots\{worker="gpu-box-1"\} 1$/m);
    expect(text).toMatch(/^gpulayer_worker_running_tasks\{worker="gpu-box-1"\} 0$/m);
    if (PROMTOOL) {
      const file = join(boxes.client.root, "worker-metrics.txt");
      writeFileSync(file, text);
      expect((await run(["sh", "-c", `promtool check metrics < ${file}`])).code).toBe(0);
    }
  });
});
