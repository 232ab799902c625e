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
 * and printed after lane 1's, so the logs do not interleave. For one file:
 * `bun test FILE`, and `bun run test:postgres FILE` for its servers on PostgreSQL.
 */
import { appendFileSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

// The slowest files of lane 1's own (in CI, 2026-12: image-env about 600 s, env-reuse 160): they balance lane 2's
// PostgreSQL run. Moving more there (wheelhouse, pip-config) put the PostgreSQL run's timed tests (server-stalls'
// p99 under 100 ms) beside the replica kill loop of cluster-durability, and they failed.
const SLOW = ["test/image-env.test.ts", "test/env-reuse.test.ts"];

const postgresInstalled = Bun.spawnSync(["sh", "-c", "ls /usr/lib/postgresql/*/bin/initdb || command -v initdb"], { stdout: "ignore", stderr: "ignore" }).exitCode === 0;
const withPostgres = postgresInstalled || process.env.GPULAYER_TEST_REQUIRE_POSTGRES === "1";

const dir = mkdtempSync(join(tmpdir(), "gpl-test-all-"));
const laneLog = join(dir, "lane2.log");

async function lane2(): Promise<number> {
  const out = openSync(laneLog, "w");
  const slow = await Bun.spawn(["bun", "test", ...SLOW], { stdio: ["ignore", out, out] }).exited;
  if (!withPostgres) {
    appendFileSync(laneLog, "\nthe tests on PostgreSQL: skipped (PostgreSQL is not installed; Debian: apt-get install postgresql)\n");
    return slow;
  }
  const pg = await Bun.spawn(["bun", "run", "scripts/test-on-postgres.ts"], { stdio: ["ignore", out, out] }).exited;
  return slow || pg;
}

const second = lane2();
const first = await Bun.spawn(["bun", "test", ...SLOW.flatMap((f) => ["--path-ignore-patterns", f])], { stdio: ["ignore", "inherit", "inherit"] }).exited;
const secondCode = await second;
console.log(`\n::: lane 2, run beside the above: ${SLOW.join(", ")}; then the tests that start servers, on PostgreSQL :::`);
console.log(readFileSync(laneLog, "utf8"));
rmSync(dir, { recursive: true, force: true });
console.log(`lane 1 (bun test, all but the slow files): exit ${first}; lane 2 (the slow files, then on PostgreSQL): exit ${secondCode}`);
process.exit(first || secondCode);
