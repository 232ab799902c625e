/**
 * The whole suite, as CI runs it: `bun run test`. Two lanes side by side, as
 * most of either is waiting on subprocesses (pip, uv, engines, servers):
 *
 * - lane 1: `bun test` on every file but the slow ones below;
 * - lane 2: the slow files, then the tests that start servers, again with the
 *   servers on PostgreSQL (`bun run test:postgres`; skipped, saying so, on a
 *   machine without PostgreSQL unless GPULAYER_TEST_REQUIRE_POSTGRES is set).
 *
 * One after the other, they came near CI's 40 minutes. Lane 2's output is held
 * and printed after lane 1's, so the logs do not interleave. Each failed test is
 * named again at the very end, with what it printed, as CI keeps only the tail
 * of a long log. For one file: `bun test FILE`, and `bun run test:postgres FILE`
 * for its servers on PostgreSQL.
 */
import { appendFileSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { hasPostgres } from "../test/fixtures/postgres";

// The slowest files of lane 1's own (in CI, 2026-12: image-env about 600 s, env-reuse 160): they balance lane 2's
// PostgreSQL run. Moving more there (wheelhouse, pip-config) put the PostgreSQL run's timed tests (server-stalls'
// p99 under 100 ms) beside the replica kill loop of cluster-durability, and they failed.
const SLOW = ["test/image-env.test.ts", "test/env-reuse.test.ts"];

const dir = mkdtempSync(join(tmpdir(), "gpl-test-all-"));
const lane1Log = join(dir, "lane1.log");
const lane2Log = join(dir, "lane2.log");

async function lane2(): Promise<number> {
  const out = openSync(lane2Log, "w");
  const slow = await Bun.spawn(["bun", "test", ...SLOW], { stdio: ["ignore", out, out] }).exited;
  if (!hasPostgres) {
    appendFileSync(lane2Log, "\nthe tests on PostgreSQL: skipped (PostgreSQL is not installed; Debian: apt-get install postgresql)\n");
    return slow;
  }
  const pg = await Bun.spawn(["bun", "run", "scripts/test-on-postgres.ts"], { stdio: ["ignore", out, out] }).exited;
  return slow || pg;
}

/** Lane 1 prints as it runs, and keeps a copy for the summary. */
async function lane1(): Promise<number> {
  const proc = Bun.spawn(["bun", "test", ...SLOW.flatMap((f) => ["--path-ignore-patterns", f])], { stdio: ["ignore", "pipe", "pipe"] });
  const tee = async (from: ReadableStream<Uint8Array>, to: NodeJS.WriteStream) => {
    for await (const chunk of from) {
      to.write(chunk);
      appendFileSync(lane1Log, chunk);
    }
  };
  await Promise.all([tee(proc.stdout, process.stdout), tee(proc.stderr, process.stderr)]);
  return proc.exited;
}

/**
 * Each `(fail)` line of a bun test log, with the lines bun printed for it (they come before it), and each
 * error bun found between tests (its lines come after its heading).
 */
function failuresIn(log: string): string[] {
  const lines = log.split("\n");
  const found: string[] = [];
  const seen = new Set<string>();
  lines.forEach((line, i) => {
    if (line.startsWith("# Unhandled error")) found.push(lines.slice(i, i + 30).join("\n"));
    // bun names each failure again in its closing summary, with nothing before it: the first, with its error, is kept.
    if (!line.startsWith("(fail)") || seen.has(line)) return;
    seen.add(line);
    let from = i;
    while (from > 0 && i - from < 40 && !/^\((pass|fail|skip|todo)\)|^test\/.*:$/.test(lines[from - 1]!)) from--;
    found.push(lines.slice(from, i + 1).join("\n"));
  });
  return found;
}

const second = lane2();
const first = await lane1();
const secondCode = await second;
console.log(`\n::: lane 2, run beside the above: ${SLOW.join(", ")}; then the tests that start servers, on PostgreSQL :::`);
console.log(readFileSync(lane2Log, "utf8"));
const failures = [...failuresIn(readFileSync(lane1Log, "utf8")).map((f) => `lane 1:\n${f}`), ...failuresIn(readFileSync(lane2Log, "utf8")).map((f) => `lane 2:\n${f}`)];
rmSync(dir, { recursive: true, force: true });
if (failures.length > 0) console.log(`\n::: ${failures.length} failed, again :::\n${failures.join("\n\n")}\n`);
console.log(`lane 1 (bun test, all but the slow files): exit ${first}; lane 2 (the slow files, then on PostgreSQL): exit ${secondCode}`);
process.exit(first || secondCode);
