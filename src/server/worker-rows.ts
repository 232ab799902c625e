import type { MachineProbe, WorkerCache, WorkerState } from "../cluster/protocol.ts";
import { chunks, marks, type Sql } from "./db/sql.ts";
import { deepFreeze, ParsedOnce } from "./parsed-once.ts";

/**
 * Worker rows as the store reads them. Dispatch and the sweep read every
 * worker on each pass, and a real worker's probe and env list are kilobytes
 * of JSON: at 1,000 workers, sending and parsing them on every pass was a
 * third of the server's CPU and most of PostgreSQL's (bench/fleet.ts). So a
 * read asks for the light columns and `rev`, and fetches the heavy ones
 * (labels, probe, cache) only for rows whose `rev` this process has not seen.
 *
 * `rev` is a fresh random value on every write of a heavy column (newRev), by
 * any replica, never a counter: a read inside a transaction that then rolled
 * back keeps values under a `rev` no committed row will ever carry.
 */

/** A worker as the server keeps it. */
export interface WorkerRow {
  id: string;
  name: string;
  labels: Record<string, string>;
  probe: MachineProbe;
  slots: number;
  state: WorkerState;
  registered: number;
  lastSeen: number;
  freeGpus: number[];
  /** The named join token it registered with (null: the server's own token); revoking that token drops the worker. */
  joinedWith: string | null;
  /** Its env cache as it last reported it; null before its first report. */
  cache: WorkerCache | null;
  /**
   * On the row a request authenticated (routes.ts), not read from the database: the hash of the credential the
   * request came with, compared with the worker's own under the change's lock (a credential replaced meanwhile, 401).
   */
  presented?: string;
}

export const WORKER_LIGHT_COLUMNS = "id, name, slots, state, registered, last_seen, free_gpus, joined_with, rev";

/** The columns whose write moves `rev`. */
export const WORKER_HEAVY_FIELDS = ["labels", "probe", "cache"] as const;

type Row = Record<string, unknown>;

interface Heavy {
  rev: string;
  labels: Record<string, string>;
  probe: MachineProbe;
  cache: WorkerCache | null;
}

/** Rows kept; past it the map is cleared before the next read (a server's workers come and go over its life), costing only fetches again. */
const MAX_KEPT = 50_000;

export function newRev(): string {
  return crypto.randomUUID();
}

const heavyKept = new Map<string, Heavy>();
const freeGpusParsed = new ParsedOnce();

/** Light rows (WORKER_LIGHT_COLUMNS) as full worker rows, heavy columns from what this process holds or one query for the rest. */
export async function workerRows(sql: Sql, light: Row[]): Promise<WorkerRow[]> {
  // Cleared before the rows are judged, never between: each row read is then either kept or fetched below.
  if (heavyKept.size > MAX_KEPT) heavyKept.clear();
  const stale = light.filter((r) => heavyKept.get(r.id as string)?.rev !== String(r.rev)).map((r) => r.id as string);
  for (const ids of chunks(stale)) {
    const rows = await sql.all(`SELECT id, rev, labels, probe, cache FROM workers WHERE id IN (${marks(ids)})`, ...ids);
    for (const r of rows) {
      heavyKept.set(r.id as string, deepFreeze({ rev: String(r.rev), labels: JSON.parse(String(r.labels)), probe: JSON.parse(String(r.probe)), cache: r.cache ? JSON.parse(String(r.cache)) : null }));
    }
  }
  const out: WorkerRow[] = [];
  for (const r of light) {
    const heavy = heavyKept.get(r.id as string);
    // Gone between the two reads (never, while workers are not deleted): as if read a moment later.
    if (heavy) out.push(toWorker(r, heavy));
  }
  return out;
}

function toWorker(r: Row, heavy: Heavy): WorkerRow {
  const id = r.id as string;
  return {
    id,
    name: r.name as string,
    labels: heavy.labels,
    probe: heavy.probe,
    slots: Number(r.slots),
    state: r.state as WorkerState,
    registered: Number(r.registered),
    lastSeen: Number(r.last_seen),
    freeGpus: freeGpusParsed.of(id, String(r.free_gpus)),
    joinedWith: (r.joined_with as string | null) ?? null,
    cache: heavy.cache,
  };
}
