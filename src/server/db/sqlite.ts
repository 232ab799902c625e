import { Database as SqliteDb } from "bun:sqlite";
import { ownerOnlyFolder } from "../../core/owner-only.ts";
import { dirname } from "node:path";
import { type Database, Mutex, type Row, type Sql, type SqlValue } from "./sql.ts";

/**
 * A transaction gives the event loop a turn after this long at most: bun's
 * SQLite answers synchronously, so a long change (a job of 1,000 tasks)
 * would otherwise hold every request, health checks included, until it ends.
 */
const SLICE_MS = 10;

/**
 * SQLite: one file in the server's home, one process. Transactions are
 * serialised in the process (a mutex) and in the file (BEGIN IMMEDIATE, for
 * `gpulayer server token` writing the same file). Reads from outside the
 * open transaction go to a second, read-only connection, which sees what
 * was last committed (WAL), never a half-made change, and need not wait for
 * the transaction to end: as on PostgreSQL, where they take another
 * connection. A write from outside waits for the transaction.
 */
export class SqliteDatabase implements Database {
  readonly dialect = "sqlite" as const;
  private readonly db: SqliteDb;
  private readonly reader: SqliteDb;
  private readonly mutex = new Mutex();
  private open: Promise<unknown> | null = null;
  private readonly inside: Sql;
  /** When work on the database last let the event loop turn. */
  private sliceStart = 0;

  constructor(readonly where: string) {
    // The server's jobs, their environment values and output: closed to others, an older gpulayer's 0755 folder too.
    ownerOnlyFolder(dirname(where));
    this.db = new SqliteDb(where, { create: true });
    this.db.exec("PRAGMA busy_timeout = 10000");
    this.db.exec("PRAGMA journal_mode = WAL");
    this.db.exec("PRAGMA synchronous = NORMAL");
    this.reader = new SqliteDb(where, { readonly: true });
    this.reader.exec("PRAGMA busy_timeout = 10000");
    // The open transaction's own queries: straight to the file (they run inside it), a turn of the event loop now and then.
    this.inside = {
      dialect: this.dialect,
      all: async <T>(q: string, ...p: SqlValue[]) => (await this.turn(), this.db.query(q).all(...p) as T[]),
      get: async <T>(q: string, ...p: SqlValue[]) => (await this.turn(), (this.db.query(q).get(...p) as T | null) ?? null),
      run: async (q: string, ...p: SqlValue[]) => (await this.turn(), this.db.query(q).run(...p).changes),
      exclusive: <T>(fn: (tx: Sql) => Promise<T>) => fn(this.inside),
      transaction: <T>(fn: (tx: Sql) => Promise<T>) => fn(this.inside),
    };
  }

  private async turn(): Promise<void> {
    if (performance.now() - this.sliceStart < SLICE_MS) return;
    await new Promise((resolve) => setImmediate(resolve));
    this.sliceStart = performance.now();
  }

  private async settled(): Promise<void> {
    while (this.open) await this.open.catch(() => {});
  }

  // Everyone else's: reads from what was committed (a turn of the event loop now and then: a status of 1,000 tasks is 2,000 reads), writes once no transaction is open.
  async all<T = Row>(query: string, ...params: SqlValue[]): Promise<T[]> {
    await this.turn();
    return this.reader.query(query).all(...params) as T[];
  }
  async get<T = Row>(query: string, ...params: SqlValue[]): Promise<T | null> {
    await this.turn();
    return (this.reader.query(query).get(...params) as T | null) ?? null;
  }
  async run(query: string, ...params: SqlValue[]): Promise<number> {
    // Looked at and written in one synchronous step: nothing may open a transaction between the look and the write, or the write would be that transaction's (and go with its rollback).
    for (;;) {
      await this.turn();
      if (!this.open) return this.db.query(query).run(...params).changes;
      await this.open.catch(() => {});
    }
  }

  exclusive<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    return this.mutex.lock(async () => {
      const work = (async () => {
        this.db.exec("BEGIN IMMEDIATE");
        this.sliceStart = performance.now();
        try {
          const result = await fn(this.inside);
          this.db.exec("COMMIT");
          return result;
        } catch (error) {
          this.db.exec("ROLLBACK");
          throw error;
        }
      })();
      this.open = work;
      try {
        return await work;
      } finally {
        this.open = null;
      }
    });
  }

  /** One connection, one writer: a transaction here is the writer lock's. */
  transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    return this.exclusive(fn);
  }

  async ping(): Promise<void> {
    this.db.query("SELECT 1").get();
  }
  async publish(): Promise<void> {}
  async subscribe(): Promise<void> {}
  async close(): Promise<void> {
    await this.settled();
    this.reader.close();
    this.db.close();
  }
}
