import { Database as SqliteDb } from "bun:sqlite";
import { ownerOnlyFolder } from "../../core/owner-only.ts";
import { dirname } from "node:path";
import { type Database, Mutex, type Row, type Sql, type SqlValue } from "./sql.ts";

/**
 * SQLite: one file in the server's home, one process. Transactions are
 * serialised in the process (a mutex) and in the file (BEGIN IMMEDIATE, for
 * `gpulayer server token` writing the same file); a query from outside the
 * open transaction waits for it, so nothing reads a half-made change.
 */
export class SqliteDatabase implements Database {
  readonly dialect = "sqlite" as const;
  private readonly db: SqliteDb;
  private readonly mutex = new Mutex();
  private open: Promise<unknown> | null = null;
  private readonly inside: Sql;

  constructor(readonly where: string) {
    // The server's jobs, their environment values and output: closed to others, an older gpulayer's 0755 folder too.
    ownerOnlyFolder(dirname(where));
    this.db = new SqliteDb(where, { create: true });
    this.db.exec("PRAGMA busy_timeout = 10000");
    this.db.exec("PRAGMA journal_mode = WAL");
    this.db.exec("PRAGMA synchronous = NORMAL");
    // The open transaction's own queries: straight to the file (they run inside it).
    this.inside = {
      dialect: this.dialect,
      all: async <T>(q: string, ...p: SqlValue[]) => this.db.query(q).all(...p) as T[],
      get: async <T>(q: string, ...p: SqlValue[]) => (this.db.query(q).get(...p) as T | null) ?? null,
      run: async (q: string, ...p: SqlValue[]) => this.db.query(q).run(...p).changes,
      exclusive: <T>(fn: (tx: Sql) => Promise<T>) => fn(this.inside),
    };
  }

  private async settled(): Promise<void> {
    while (this.open) await this.open.catch(() => {});
  }

  // Everyone else's: once no transaction is open.
  async all<T = Row>(query: string, ...params: SqlValue[]): Promise<T[]> {
    await this.settled();
    return this.inside.all<T>(query, ...params);
  }
  async get<T = Row>(query: string, ...params: SqlValue[]): Promise<T | null> {
    await this.settled();
    return this.inside.get<T>(query, ...params);
  }
  async run(query: string, ...params: SqlValue[]): Promise<number> {
    await this.settled();
    return this.inside.run(query, ...params);
  }

  exclusive<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    return this.mutex.lock(async () => {
      const work = (async () => {
        this.db.exec("BEGIN IMMEDIATE");
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

  async ping(): Promise<void> {
    this.db.query("SELECT 1").get();
  }
  async publish(): Promise<void> {}
  async subscribe(): Promise<void> {}
  async close(): Promise<void> {
    await this.settled();
    this.db.close();
  }
}
