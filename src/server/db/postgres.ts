import { DatabaseDown, type Database, Mutex, numbered, type Row, type Sql, type SqlValue } from "./sql.ts";

/**
 * PostgreSQL through Bun's own client: any number of replicas on one
 * database. The writer lock is a transaction-scoped advisory lock (released
 * by COMMIT, ROLLBACK or a dead connection, never left held by a dead
 * replica); wake-ups between replicas go by NOTIFY on one channel.
 */

/** pg_advisory_xact_lock's key for the coordinator's writer lock (any fixed number; "gpl" in ASCII). */
export const WRITER_LOCK = 0x67706c;
const CHANNEL = "gpulayer";
/** How long a change's keys wait for others to share one NOTIFY. */
const PUBLISH_GATHER_MS = 3;

type Client = InstanceType<typeof Bun.SQL>;

/** A connection that failed, as opposed to a query the database refused. */
function down(error: unknown): unknown {
  const code = String((error as { code?: unknown }).code ?? "");
  if (/^ERR_POSTGRES_(CONNECTION|SERVER_CLOSED|IDLE_TIMEOUT|LIFETIME)/.test(code) || /^(ECONNREFUSED|ECONNRESET|ETIMEDOUT)$/.test(code)) {
    const what = /REFUSED/.test(code) ? "connection refused" : /TIMEOUT|ETIMEDOUT/.test(code) ? "no answer in time" : "connection closed";
    return new DatabaseDown(`the database does not answer (${what})`);
  }
  // SQLSTATE class 08 (connection exception) and 57P0x (the server shutting down, crashed, or not yet up): the database went away mid-query.
  const state = String((error as { errno?: unknown }).errno ?? "");
  if (/^08|^57P0[1-3]$/.test(state)) return new DatabaseDown(`the database went away (${(error as Error).message})`);
  return error;
}

function over(client: Pick<Client, "unsafe">, exclusive: Sql["exclusive"], transaction: Sql["transaction"]): Sql {
  const all = async <T>(q: string, ...p: SqlValue[]): Promise<T[]> => {
    try {
      return [...((await client.unsafe(numbered(q), p)) as T[])];
    } catch (error) {
      throw down(error);
    }
  };
  return {
    dialect: "postgres",
    all,
    get: async <T>(q: string, ...p: SqlValue[]) => ((await all<T>(q, ...p))[0] ?? null),
    run: async (q: string, ...p: SqlValue[]) => {
      try {
        return ((await client.unsafe(numbered(q), p)) as unknown as { count: number }).count ?? 0;
      } catch (error) {
        throw down(error);
      }
    },
    exclusive,
    transaction,
  };
}

export class PostgresDatabase implements Database {
  readonly dialect = "postgres" as const;
  readonly where: string;
  private readonly client: Client;
  private readonly pool: Sql;
  private unlisten: (() => Promise<void>) | null = null;
  /** Keys not yet published, and the send that takes them (publish). */
  private readonly unsent = new Set<string>();
  private sending: Promise<void> | null = null;
  /**
   * This process's writer-lock changes, one at a time before they take a
   * connection: the others wait here, not in the pool, where each would hold
   * one of its connections while waiting for the lock, and starve the
   * changes that need no lock (measured: beats answered after seconds).
   */
  private readonly writers = new Mutex();

  constructor(url: string) {
    const u = new URL(url);
    this.where = `postgres://${u.host}${u.pathname}`;
    this.client = new Bun.SQL(url, { max: 10, connectionTimeout: 5, idleTimeout: 60 });
    this.pool = over(
      this.client,
      (fn) => this.exclusive(fn),
      (fn) => this.transaction(fn),
    );
  }

  all<T = Row>(query: string, ...params: SqlValue[]): Promise<T[]> {
    return this.pool.all<T>(query, ...params);
  }
  get<T = Row>(query: string, ...params: SqlValue[]): Promise<T | null> {
    return this.pool.get<T>(query, ...params);
  }
  run(query: string, ...params: SqlValue[]): Promise<number> {
    return this.pool.run(query, ...params);
  }

  exclusive<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    return this.writers.lock(() => this.begin(true, fn));
  }

  transaction<T>(fn: (tx: Sql) => Promise<T>): Promise<T> {
    return this.begin(false, fn);
  }

  private async begin<T>(writer: boolean, fn: (tx: Sql) => Promise<T>): Promise<T> {
    try {
      return (await this.client.begin(async (tx) => {
        if (writer) await tx.unsafe("SELECT pg_advisory_xact_lock($1)", [WRITER_LOCK]);
        const join = <U>(inner: (tx: Sql) => Promise<U>) => inner(inside);
        const inside: Sql = over(tx, join, join);
        return fn(inside);
      })) as T;
    } catch (error) {
      throw down(error);
    }
  }

  /**
   * Settings under which a commit is acknowledged before it is on disk: a
   * crash of the database then loses changes the replicas answered for (a
   * job answered 201, a task already handed to a worker).
   */
  async unsafeSettings(): Promise<string[]> {
    const rows = await this.pool.all<{ name: string; setting: string }>("SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit') ORDER BY name");
    return rows.filter((r) => r.setting === "off").map((r) => `${r.name}=off`);
  }

  async ping(): Promise<void> {
    await this.pool.get("SELECT 1 AS ok");
  }

  /**
   * Keys of changes for the other replicas, gathered for a moment and sent as few notifications as they fit (a
   * key a line: ids hold no newline; NOTIFY takes 8000 bytes): at hundreds of changes a second, one NOTIFY each
   * was a pooled round trip each. The other replicas hear of a change PUBLISH_GATHER_MS later at most.
   */
  publish(keys: string[]): Promise<void> {
    for (const key of keys) this.unsent.add(key);
    this.sending ??= Bun.sleep(PUBLISH_GATHER_MS).then(() => {
      const batch = [...this.unsent];
      this.unsent.clear();
      this.sending = null;
      return this.notify(batch);
    });
    return this.sending;
  }

  private async notify(keys: string[]): Promise<void> {
    let batch: string[] = [];
    let bytes = 0;
    const send = () => this.pool.run("SELECT pg_notify(?, ?)", CHANNEL, batch.join("\n"));
    for (const key of keys) {
      if (batch.length && bytes + key.length + 1 > 7_900) {
        await send();
        batch = [];
        bytes = 0;
      }
      batch.push(key);
      bytes += key.length + 1;
    }
    if (batch.length) await send();
  }

  async subscribe(onKey: (key: string) => void): Promise<void> {
    try {
      const listening = (await this.client.listen(CHANNEL, (payload: string) => payload.split("\n").forEach(onKey))) as unknown as { unlisten(): Promise<void> };
      this.unlisten = () => listening.unlisten();
    } catch (error) {
      throw down(error);
    }
  }

  async close(): Promise<void> {
    try {
      await this.unlisten?.();
    } catch {
      // the listening connection is gone already: closing goes on
    }
    await this.client.close({ timeout: 1 });
  }
}
