import { expect, test } from "bun:test";
import { Database } from "bun:sqlite";
import { statSync } from "node:fs";
import { join } from "node:path";
import { Outbox } from "../src/worker/outbox.ts";
import { tempDir } from "./helpers.ts";
import { homeLayout } from "../src/config/paths.ts";

/** A worker's outbox gives back the disk its acknowledged items took: a job's big output must not stay a big file. */

const root = tempDir();

const sizeOf = (home: string) => {
  const file = join(home, "cluster", "outbox.db");
  const wal = statSync(`${file}-wal`, { throwIfNoEntry: false })?.size ?? 0;
  return statSync(file).size + wal;
};
const chunk = new Uint8Array(256 * 1024).fill(7);

test("40 MB of output, sent and acknowledged: the file is back to a few MB, and what is still owed stays", () => {
  const home = join(root, "new");
  const outbox = new Outbox(homeLayout(home));
  let last = 0;
  for (let i = 0; i < 160; i++) last = outbox.append("t1", "output", chunk, "stdout");
  outbox.append("t2", "event", "{}");
  expect(sizeOf(home)).toBeGreaterThan(40 * 1024 * 1024);
  // Other jobs' output: the worker's alone, its WAL too (a --run-as job user reaches the folder beside it).
  for (const f of ["outbox.db", "outbox.db-wal"]) expect(statSync(join(home, "cluster", f)).mode & 0o777).toBe(0o600);
  outbox.ack("t1", last);
  outbox.close();
  expect(sizeOf(home)).toBeLessThan(16 * 1024 * 1024);
  const again = new Outbox(homeLayout(home));
  expect(again.pendingTasks()).toEqual(["t2"]);
  again.close();
});

test("a file an older gpulayer made (no auto_vacuum), opened empty, is converted and shrinks", () => {
  const home = join(root, "old");
  const outbox = new Outbox(homeLayout(home));
  outbox.close();
  // As before this change: a file without auto_vacuum, its freed pages kept.
  const file = join(home, "cluster", "outbox.db");
  const db = new Database(file);
  db.exec("PRAGMA auto_vacuum = NONE; VACUUM;");
  expect(db.query<{ auto_vacuum: number }, []>("PRAGMA auto_vacuum").get()!.auto_vacuum).toBe(0);
  const insert = db.query("INSERT INTO items (task, seq, kind, stream, body) VALUES ('old', ?, 'output', 'stdout', ?)");
  for (let i = 1; i <= 80; i++) insert.run(i, chunk);
  db.exec("DELETE FROM items; PRAGMA wal_checkpoint(TRUNCATE);");
  db.close();
  expect(sizeOf(home)).toBeGreaterThan(20 * 1024 * 1024);
  new Outbox(homeLayout(home)).close();
  expect(sizeOf(home)).toBeLessThan(4 * 1024 * 1024);
});

test("a batch: small items of several kinds together (a finish last), big output alone, a handback alone", () => {
  const outbox = new Outbox(homeLayout(join(root, "batches")));
  const big = new Uint8Array(100 * 1024).fill(1);
  outbox.append("t", "event", "{}");
  outbox.append("t", "output", "ok\n", "stdout");
  outbox.append("t", "output", big, "stdout");
  outbox.append("t", "output", "err\n", "stderr");
  outbox.append("t", "event", "{}");
  outbox.append("t", "finish", "{}");
  outbox.append("t", "event", "{}");
  const kinds = () => outbox.batch("t", 1024 * 1024, 64 * 1024).map((i) => `${i.seq}:${i.kind}${i.stream ? `/${i.stream}` : ""}`);
  const next = () => {
    const b = kinds();
    outbox.ack("t", Number(b.at(-1)!.split(":")[0]));
    return b;
  };
  // Mixed up to 64 KiB: the big output does not join; alone, it is one kind's run up to 1 MiB.
  expect(next()).toEqual(["1:event", "2:output/stdout"]);
  expect(next()).toEqual(["3:output/stdout"]);
  expect(next()).toEqual(["4:output/stderr", "5:event", "6:finish"]);
  expect(next()).toEqual(["7:event"]);
  // Without mixing (a server older than /reports): one kind at a time, as before.
  outbox.append("t", "event", "{}");
  outbox.append("t", "output", "x", "stdout");
  outbox.append("t", "handback", "{}");
  expect(outbox.batch("t", 1024 * 1024).map((i) => i.kind)).toEqual(["event"]);
  outbox.ack("t", 8);
  expect(outbox.batch("t", 1024 * 1024, 64 * 1024).map((i) => i.kind)).toEqual(["output"]);
  outbox.ack("t", 9);
  expect(outbox.batch("t", 1024 * 1024, 64 * 1024).map((i) => i.kind)).toEqual(["handback"]);
  outbox.close();
});
