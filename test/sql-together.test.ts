import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { PostgresDatabase } from "../src/server/db/postgres.ts";
import { type Database, together } from "../src/server/db/sql.ts";
import { SqliteDatabase } from "../src/server/db/sqlite.ts";
import { hasPostgres, postgresForFile } from "./fixtures/postgres.ts";
import { tempDir } from "./helpers.ts";

/**
 * Statements of one transaction sent together (db/sql.ts `together`): when
 * one fails, the transaction rolls back whole, and none of the others runs
 * after it outside the transaction (SQLite would commit such a statement on
 * its own) or inside the next one.
 */

const pg = postgresForFile();
const root = tempDir();
afterAll(() => rmSync(root, { recursive: true, force: true }));

const places: [string, () => Promise<Database>][] = [
  ["SQLite", async () => (mkdirSync(join(root, "s"), { recursive: true }), new SqliteDatabase(join(root, "s", `${crypto.randomUUID()}.db`)))],
  ["PostgreSQL", async () => new PostgresDatabase(await pg()!.database())],
];

for (const [label, open] of places) {
  // PostgreSQL is skipped only on a machine without it; CI requires it (GPULAYER_TEST_REQUIRE_POSTGRES).
  describe.skipIf(label === "PostgreSQL" && !hasPostgres)(`statements sent together (${label})`, () => {
    test("one fails: the transaction is rolled back whole, and the others' later statements run in no transaction after it", async () => {
      const db = await open();
      try {
        await db.run("CREATE TABLE t (id INTEGER PRIMARY KEY)");
        await db.run("INSERT INTO t (id) VALUES (1)");
        const failing = db.exclusive((tx) =>
          together(
            async () => {
              await tx.run("INSERT INTO t (id) VALUES (10)");
              await tx.run("INSERT INTO t (id) VALUES (11)");
            },
            () => tx.run("INSERT INTO t (id) VALUES (1)"),
            async () => {
              await tx.run("INSERT INTO t (id) VALUES (20)");
              await tx.run("INSERT INTO t (id) VALUES (21)");
              await tx.run("INSERT INTO t (id) VALUES (22)");
            },
          ),
        );
        await expect(failing).rejects.toThrow();
        // The next change sees none of it, and adds only its own.
        await db.exclusive((tx) => tx.run("INSERT INTO t (id) VALUES (2)"));
        await Bun.sleep(50);
        expect((await db.all<{ id: number }>("SELECT id FROM t ORDER BY id")).map((r) => Number(r.id))).toEqual([1, 2]);
      } finally {
        await db.close();
      }
    });
  });
}
