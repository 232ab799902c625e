/**
 * The server's database, SQLite or PostgreSQL, behind one small async
 * interface. Queries are written once, with `?` placeholders, in the SQL
 * both dialects share (ON CONFLICT, RETURNING, LIKE); the few places that
 * differ ask `dialect`. Every coordinator change runs in `exclusive`: one
 * transaction at a time across every replica on the database (SQLite: the
 * one process, BEGIN IMMEDIATE; PostgreSQL: a transaction-scoped advisory
 * lock), so a job is dispatched once and a worker is declared lost once.
 */

export type SqlValue = string | number | null | Uint8Array;
export type Row = Record<string, unknown>;
export type Dialect = "sqlite" | "postgres";

export interface Sql {
  readonly dialect: Dialect;
  all<T = Row>(query: string, ...params: SqlValue[]): Promise<T[]>;
  get<T = Row>(query: string, ...params: SqlValue[]): Promise<T | null>;
  /** Rows changed. */
  run(query: string, ...params: SqlValue[]): Promise<number>;
  /** `fn` in one transaction holding the database-wide writer lock; nested calls on the transaction's own Sql join it. */
  exclusive<T>(fn: (tx: Sql) => Promise<T>): Promise<T>;
  /**
   * `fn` in one transaction without the writer lock (PostgreSQL; SQLite has
   * only that lock, and takes it): what it decides must rest on rows it has
   * locked (SELECT … FOR UPDATE, an UPDATE's WHERE), which other changes,
   * locked or not, wait for. Nested calls join it.
   */
  transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T>;
}

/** Ids in one statement at most: well under either database's limit on parameters. */
export const CHUNK = 500;
export const chunks = (ids: string[]): string[][] => Array.from({ length: Math.ceil(ids.length / CHUNK) }, (_, i) => ids.slice(i * CHUNK, (i + 1) * CHUNK));
/** One `?` per id, for `IN (...)`. */
export const marks = (ids: string[]): string => ids.map(() => "?").join(", ");

/**
 * Statements of one transaction sent together: started in this order (PostgreSQL runs them in turn on the
 * transaction's connection: one round trip, not one each), and all settled before this answers, so a failure of
 * one never ends the transaction while another still runs (SQLite would run it after the ROLLBACK, outside it).
 * The first failure is thrown.
 */
export async function together<T extends readonly (() => Promise<unknown>)[]>(...statements: T): Promise<{ [K in keyof T]: Awaited<ReturnType<T[K]>> }> {
  const settled = await Promise.allSettled(statements.map((start) => start()));
  const failed = settled.find((r) => r.status === "rejected");
  if (failed) throw (failed as PromiseRejectedResult).reason;
  return settled.map((r) => (r as PromiseFulfilledResult<unknown>).value) as { [K in keyof T]: Awaited<ReturnType<T[K]>> };
}

/** Two transactions each waited for a row the other held (SQLSTATE 40P01): PostgreSQL rolled one back, which may run again whole. */
export function isDeadlock(error: unknown): boolean {
  return String((error as { errno?: unknown }).errno ?? "") === "40P01";
}

/** A lock waited for longer than the transaction's lock_timeout (SQLSTATE 55P03). */
export function isLockTimeout(error: unknown): boolean {
  return String((error as { errno?: unknown }).errno ?? "") === "55P03";
}

export interface Database extends Sql {
  /** Where the database is, credentials left out: what the server prints. */
  readonly where: string;
  /** A cheap round trip: whether the database answers now. */
  ping(): Promise<void>;
  /** Wake-ups for other replicas (PostgreSQL NOTIFY, one per change); on SQLite there are none. */
  publish(keys: string[]): Promise<void>;
  subscribe(onKey: (key: string) => void): Promise<void>;
  close(): Promise<void>;
}

/** Queries already numbered: a busy server sends the same few hundred texts over and over. */
const numberedTexts = new Map<string, string>();
const NUMBERED_KEPT = 4_096;

/** `?` → `$1, $2, …` (our queries hold no `?` inside literals). */
export function numbered(query: string): string {
  let text = numberedTexts.get(query);
  if (text !== undefined) return text;
  let n = 0;
  text = query.replace(/\?/g, () => `$${++n}`);
  // Lists of every length are texts of their own: past the bound, start again rather than keep them all.
  if (numberedTexts.size >= NUMBERED_KEPT) numberedTexts.clear();
  numberedTexts.set(query, text);
  return text;
}

/** The database could not be reached (a replica then takes no work and says so), as opposed to a query's own error. */
export class DatabaseDown extends Error {}

/** A strictly increasing chain: callers run one after another. */
export class Mutex {
  private tail: Promise<void> = Promise.resolve();
  async lock<T>(fn: () => Promise<T>): Promise<T> {
    const before = this.tail;
    let release!: () => void;
    this.tail = new Promise<void>((r) => (release = r));
    await before;
    try {
      return await fn();
    } finally {
      release();
    }
  }
}
