import type { JobEventData, JobEventName, RecordedEvent } from "../jobs/model.ts";
import { CHUNK, chunks, type Sql, type SqlValue } from "./db/sql.ts";

/**
 * The advisory locks' first key for a stream of events one reader follows with one seq mark (a job's events; a
 * prepare's build steps, by its group): "gps" in ASCII. PostgreSQL draws a seq at the insert and shows the row at the
 * commit, so two writers' events (a worker's report and the server's own, through two replicas) can be seen out of
 * seq order, and a reader whose mark passed the later never sees the earlier. Each insert holds the stream's lock
 * shared to its commit (writers never wait on each other); a follower takes it alone to read, which waits for the
 * writers in flight: every seq drawn before its read is committed when it reads.
 */
export const STREAM_LOCK_CLASS = 0x677073;

/** An event to insert: the job whose row it is, and the stream its reader follows (the job itself, or a prepare's group). */
export interface StreamEvent extends Pick<RecordedEvent, "type" | "data"> {
  jobId: string;
  stream: string;
}

/** One of this version's events for a job, in its own stream. */
export function jobEvent<N extends JobEventName>(jobId: string, type: N, data: JobEventData[N]): StreamEvent {
  return { jobId, stream: jobId, type, data: data as Record<string, unknown> };
}

/** Events in one statement at most (4 parameters each). */
const EVENTS_PER_STATEMENT = 500;

/**
 * The streams' locks, shared, in one order (by their keys): a writer of several streams (a dispatch pass) never
 * holds one while it waits for another that a writer holding that one waits on. Held to the commit.
 */
function streamLocks(streams: string[]): { from: string; params: string[] } {
  const distinct = [...new Set(streams)];
  return {
    from: `(SELECT count(pg_advisory_xact_lock_shared(${STREAM_LOCK_CLASS}, k)) AS held FROM (SELECT DISTINCT hashtext(s) AS k FROM (VALUES ${distinct.map(() => "(?::text)").join(", ")}) AS x(s) ORDER BY k) AS keys) AS l`,
    params: distinct,
  };
}

/**
 * Events of one stream or several, in order, in as few statements as they fit: a pass handing out a hundred jobs
 * writes their events in one round trip, not a hundred. On PostgreSQL each statement takes its streams' locks
 * before it draws the first seq; `serialize`: a column's value as the store keeps it.
 */
export async function insertEvents(sql: Sql, events: StreamEvent[], serialize: (v: unknown) => SqlValue): Promise<void> {
  const now = Date.now();
  for (let k = 0; k < events.length; k += EVENTS_PER_STATEMENT) {
    const some = events.slice(k, k + EVENTS_PER_STATEMENT);
    const values = some.flatMap((e) => [e.jobId, now, e.type, serialize(e.data)]);
    if (sql.dialect !== "postgres") {
      await sql.run(`INSERT INTO events (job_id, ts, type, data) VALUES ${some.map(() => "(?, ?, ?, ?)").join(", ")}`, ...values);
      continue;
    }
    // The locks' one row joins every row inserted, so they are held before the first seq is drawn; the ordinal keeps the events' order.
    const locks = streamLocks(some.map((e) => e.stream));
    const rows = some.map((_, i) => `(${i}, ?::text, ?::float8, ?::text, ?::text)`).join(", ");
    await sql.run(`INSERT INTO events (job_id, ts, type, data) SELECT v.job_id, v.ts, v.type, v.data FROM ${locks.from}, (VALUES ${rows}) AS v(n, job_id, ts, type, data) ORDER BY v.n`, ...locks.params, ...values);
  }
}

/** The streams' locks, shared, to the commit (PostgreSQL; SQLite's writers are one at a time): taken before rows they guard, as every writer does. */
export async function holdStreams(sql: Sql, streams: string[]): Promise<void> {
  if (sql.dialect !== "postgres") return;
  const distinct = [...new Set(streams)];
  if (!distinct.length) return;
  // One statement takes its keys in order; past one statement's worth, in key order across statements too.
  for (const some of distinct.length <= CHUNK ? [distinct] : chunks(await sortedByKey(sql, distinct))) {
    const locks = streamLocks(some);
    await sql.get(`SELECT l.held FROM ${locks.from}`, ...locks.params);
  }
}

/** Streams in their locks' key order (hashtext's, which only the database computes). */
async function sortedByKey(sql: Sql, streams: string[]): Promise<string[]> {
  if (streams.length <= 1) return streams;
  const out: { s: string; k: number }[] = [];
  for (const some of chunks(streams)) out.push(...(await sql.all<{ s: string; k: number }>(`SELECT s, hashtext(s) AS k FROM (VALUES ${some.map(() => "(?::text)").join(", ")}) AS x(s)`, ...some)));
  return out.sort((a, b) => a.k - b.k).map((r) => r.s);
}
