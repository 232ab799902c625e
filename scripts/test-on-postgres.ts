/**
 * The tests that start servers, again with every server keeping its state in
 * PostgreSQL (a throw-away cluster, test/fixtures/postgres.ts): one suite for
 * both stores. `bun run test:postgres [FILES…]`; `bun run test` (scripts/test-all.ts) runs it beside `bun test`.
 */
import { readdirSync, readFileSync } from "node:fs";
import { startPostgres } from "../test/fixtures/postgres.ts";

const given = process.argv.slice(2);
// Every test file that starts `gpulayer server`, but those that bring their own PostgreSQL (the replicas', the lost wake-ups', the durability kill loop, the beats') and the container images' (no server logic of its own, and slow).
const OWN = new Set(["cluster-replicas.test.ts", "cluster-durability.test.ts", "cluster-beats.test.ts", "replica-wakeups.test.ts", "image-env.test.ts"]);
const files = given.length
  ? given
  : readdirSync("test")
      .filter((f) => f.endsWith(".test.ts") && !OWN.has(f))
      .filter((f) => /"server", "--listen"|\["server"/.test(readFileSync(`test/${f}`, "utf8")))
      .map((f) => `test/${f}`);
const pg = await startPostgres();
let code = 1;
try {
  console.error(`the tests of ${files.length} file(s) with their servers on PostgreSQL (${pg.url})`);
  const run = Bun.spawn(["bun", "test", ...files], { env: { ...process.env, GPULAYER_TEST_SERVER_DATABASE: pg.url }, stdio: ["ignore", "inherit", "inherit"] });
  code = await run.exited;
} finally {
  await pg.close();
}
process.exit(code);
