/**
 * Soak: many jobs over three workers and a server on 127.0.0.1 while worker
 * agents and the server are SIGKILLed at random (bounded in count and time)
 * and started again, and local `job run`s are SIGKILLed beside them. Then
 * every remote job must have succeeded exactly once with every output line
 * once, no two attempts of a job may ever have run at the same time (each
 * attempt checks, as it starts, that no earlier attempt of its job still
 * lives), and every killed local job must have a final state.
 *
 * Not part of the test run: it takes minutes. Run: bun run bench/soak.ts
 * (SOAK_JOBS=200, SOAK_CHAOS_SECONDS=90, SOAK_LOCAL=20 by default).
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { binary, machine, writeReport } from "./_lib.ts";

const bin = binary();
const JOBS = Number(process.env.SOAK_JOBS ?? 200);
const CHAOS_S = Number(process.env.SOAK_CHAOS_SECONDS ?? 90);
const LOCAL = Number(process.env.SOAK_LOCAL ?? 20);
const LINES = 5;
const root = mkdtempSync(join(tmpdir(), "gpl-bench-soak-"));
const token = `soak-${crypto.randomUUID()}`;
const ledger = join(root, "ledger");
const base: Record<string, string> = { ...(process.env as Record<string, string>), GPULAYER_WORKER_ENGINE: "none", PIP_CONFIG_FILE: "/dev/null" };
for (const k of Object.keys(base)) if (k.startsWith("GPULAYER_") && k !== "GPULAYER_WORKER_ENGINE") delete base[k];
const fast = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "2", GPULAYER_WORKER_LEASE: "6", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1", GPULAYER_JOB_MAX_ATTEMPTS: "20", GPULAYER_WORKER_SLOTS: "4" };
const home = (name: string) => ({ ...base, ...fast, GPULAYER_HOME: join(root, name), GPULAYER_TOKEN: token });
const python = Bun.which("python3")!;

let port = 0;
let url = "";
const procs = new Map<string, Bun.Subprocess>();
const counts = { workerKills: 0, serverKills: 0, localKills: 0 };

function spawn(name: string, args: string[], env: Record<string, string>): Bun.Subprocess {
  const p = Bun.spawn([bin, ...args], { env, stdin: "ignore", stdout: "pipe", stderr: process.env.SOAK_VERBOSE ? "inherit" : "ignore" });
  void (async () => {
    for await (const _ of p.stdout as ReadableStream<Uint8Array>);
  })();
  procs.set(name, p);
  return p;
}

async function startServer(): Promise<void> {
  const p = Bun.spawn([bin, "server", "--listen", `127.0.0.1:${port}`, "--json"], { env: home("server"), stdin: "ignore", stdout: "pipe", stderr: "ignore" });
  let doc = "";
  for await (const c of p.stdout as ReadableStream<Uint8Array>) {
    doc += new TextDecoder().decode(c);
    if (doc.trimEnd().endsWith("}")) break;
  }
  procs.set("server", p);
  url = JSON.parse(doc).url;
  port = Number(new URL(url).port);
}

const startWorker = (n: string) => spawn(n, ["join", url, "--name", n, "--python", python], home(n));
const client = () => ({ ...base, GPULAYER_SERVER: url, GPULAYER_TOKEN: token, GPULAYER_HOME: join(root, "client") });
async function gpl(args: string[], env: Record<string, string> = client()): Promise<{ code: number; out: string }> {
  const p = Bun.spawn([bin, ...args], { env, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const out = await new Response(p.stdout).text();
  return { code: await p.exited, out };
}

/**
 * Each attempt: any earlier attempt of this job still alive is an overlap
 * (alive: its pid there, not a zombie, with the start time it recorded: pids
 * wrap quickly here), then its own start, then its lines.
 */
const jobScript = [
  'touch "$LEDGER"',
  'me() { sed "s/.*) //" /proc/$1/stat 2>/dev/null; }',
  'grep "^start $JOBN " "$LEDGER" | while read -r _ _ p st; do s=$(me $p); [ -n "$s" ] || continue; set -- $s; [ "$1" != Z ] && [ "\${20}" = "$st" ] && echo "overlap $JOBN $p" >> "$LEDGER"; done',
  'echo "start $JOBN $$ $(me $$ | cut -d" " -f20)" >> "$LEDGER"',
  `for i in $(seq 1 ${LINES}); do echo "$JOBN:line-$i"; sleep 0.2; done`,
].join("; ");

const pick = <T>(xs: T[]) => xs[Math.floor(Math.random() * xs.length)]!;
const workers = ["w1", "w2", "w3"];

try {
  mkdirSync(join(root, "client"), { recursive: true });
  await startServer();
  for (const w of workers) startWorker(w);
  for (let i = 0; i < 100; i++) {
    const r = await gpl(["workers", "--json"]);
    if (r.code === 0 && JSON.parse(r.out).length === 3) break;
    await Bun.sleep(200);
  }
  const started = performance.now();
  const ids: string[] = [];
  for (let n = 0; n < JOBS; n++) {
    const r = await gpl(["job", "run", "-d", "-e", `JOBN=${n}`, "-e", `LEDGER=${ledger}`, "--", "sh", "-c", jobScript]);
    if (r.code !== 0) throw new Error(`submitting job ${n} failed`);
    ids.push(r.out.trim());
  }

  // Local jobs beside the cluster, their runners killed at random.
  const locals: { p: Bun.Subprocess; killed: boolean }[] = [];
  for (let n = 0; n < LOCAL; n++) locals.push({ p: Bun.spawn([bin, "job", "run", "--python", python, "--", "sh", "-c", `sleep ${20 + Math.floor(Math.random() * 40)}; echo local-done`], { env: { ...base, GPULAYER_HOME: join(root, "local") }, stdin: "ignore", stdout: "ignore", stderr: "ignore" }), killed: false });

  const chaosEnd = Date.now() + CHAOS_S * 1000;
  while (Date.now() < chaosEnd) {
    await Bun.sleep(2000 + Math.random() * 4000);
    // Beside each worker or server kill, a local runner, until half of them are killed.
    const local = locals.find((x) => !x.killed && x.p.exitCode === null);
    if (local && counts.localKills < LOCAL / 2) {
      local.p.kill("SIGKILL");
      local.killed = true;
      counts.localKills++;
    }
    const roll = Math.random();
    if (roll < 0.6 && counts.workerKills < 12) {
      const w = pick(workers);
      procs.get(w)?.kill("SIGKILL");
      await procs.get(w)?.exited;
      counts.workerKills++;
      await Bun.sleep(Math.random() * 2000);
      startWorker(w);
    } else if (roll < 0.8 && counts.serverKills < 4) {
      procs.get("server")?.kill("SIGKILL");
      await procs.get("server")?.exited;
      counts.serverKills++;
      await Bun.sleep(1000 + Math.random() * 4000);
      await startServer();
    }
  }

  // Settle: everything final.
  const deadline = Date.now() + 10 * 60_000;
  let states: { id: string; state: string; attempts: number }[] = [];
  for (;;) {
    const r = await gpl(["job", "list", "--json", "--limit", String(JOBS + 10)]);
    if (r.code === 0) states = JSON.parse(r.out);
    if (states.length >= JOBS && states.every((s) => ["succeeded", "failed", "cancelled"].includes(s.state))) break;
    if (Date.now() > deadline) throw new Error(`jobs not final after 10 minutes: ${states.filter((s) => !["succeeded", "failed", "cancelled"].includes(s.state)).length} left`);
    await Bun.sleep(1000);
  }
  const seconds = (performance.now() - started) / 1000;
  for (const l of locals) await l.p.exited;

  // Checks.
  const problems: string[] = [];
  const byId = new Map(states.map((s) => [s.id, s]));
  let lines = 0;
  let partial = 0;
  for (const [n, id] of ids.entries()) {
    const s = byId.get(id);
    if (s?.state !== "succeeded") problems.push(`job ${n} (${id}) ended ${s?.state}`);
    // The log holds every attempt's output in turn: each a run of line-1, line-2, … with none missing or doubled, the last one whole.
    const out = (await gpl(["job", "logs", id])).out.trim().split("\n");
    const runs: string[][] = [];
    for (const line of out) {
      if (line === `${n}:line-1`) runs.push([]);
      (runs.at(-1) ?? runs[runs.push([]) - 1]!).push(line);
    }
    const prefix = (r: string[]) => r.every((l, i) => l === `${n}:line-${i + 1}`);
    if (!runs.length || !runs.every(prefix) || runs.at(-1)!.length !== LINES || runs.length > (s?.attempts ?? 1)) problems.push(`job ${n} (${id}), ${s?.attempts} attempt(s): output ${JSON.stringify(out)}`);
    lines += runs.at(-1)?.length ?? 0;
    partial += runs.length - 1;
  }
  const ledgerText = existsSync(ledger) ? readFileSync(ledger, "utf8") : "";
  const overlaps = ledgerText.split("\n").filter((l) => l.startsWith("overlap "));
  problems.push(...overlaps.map((o) => `two attempts at once: ${o}`));
  const attempts = states.filter((s) => ids.includes(s.id)).map((s) => s.attempts);
  const rerun = attempts.filter((a) => a > 1).length;
  const localStates = JSON.parse((await gpl(["job", "list", "--json", "--limit", "100"], { ...base, GPULAYER_HOME: join(root, "local") })).out) as { state: string }[];
  const unsettled = localStates.filter((s) => !["succeeded", "failed", "cancelled", "lost"].includes(s.state));
  if (unsettled.length) problems.push(`${unsettled.length} local job(s) left ${[...new Set(unsettled.map((s) => s.state))].join(", ")} after their runner died`);

  const report = [
    `machine: ${machine()}; ${JOBS} jobs over 3 workers (4 slots each) and ${LOCAL} local jobs, ${CHAOS_S} s of chaos`,
    "",
    "| figure | value |",
    "|---|---:|",
    `| workers SIGKILLed (and started again) | ${counts.workerKills} |`,
    `| server SIGKILLed (and started again) | ${counts.serverKills} |`,
    `| local \`job run\`s SIGKILLed | ${counts.localKills} |`,
    `| remote jobs succeeded | ${states.filter((s) => ids.includes(s.id) && s.state === "succeeded").length} / ${JOBS} |`,
    `| jobs that needed more than one attempt | ${rerun} (most attempts: ${Math.max(...attempts)}) |`,
    `| output lines of the final attempts, expected / delivered exactly once | ${JOBS * LINES} / ${lines} |`,
    `| earlier attempts' partial output kept in the log, each in order, none doubled | ${partial} |`,
    `| two attempts of one job alive at once | ${overlaps.length} |`,
    `| local jobs: succeeded / failed (their runner killed) / left unsettled | ${localStates.filter((x) => x.state === "succeeded").length} / ${localStates.filter((x) => x.state === "failed").length} / ${unsettled.length} |`,
    `| wall time, first submit to all final | ${seconds.toFixed(0)} s |`,
    "",
    problems.length ? `problems (${problems.length}):\n${problems.slice(0, 20).map((p) => `- ${p}`).join("\n")}` : "no problems found",
  ].join("\n");
  console.log(report);
  writeReport("bench-soak.md", `# Soak (bench/soak.ts)\n\n${report}\n`);
  if (problems.length) process.exitCode = 1;
} finally {
  for (const p of procs.values()) p.kill("SIGKILL");
  await Promise.all([...procs.values()].map((p) => p.exited));
  Bun.spawnSync(["sh", "-c", `pkill -KILL -f ${JSON.stringify(ledger)} || true`]);
  rmSync(root, { recursive: true, force: true });
}
