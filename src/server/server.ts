import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { contentHash } from "../core/hashing.ts";
import { join } from "node:path";
import { printable } from "../ui/escape.ts";
import { formatBytes } from "../core/units.ts";
import { type BundleLimits, bundleLimits } from "../cluster/bundle.ts";
import type { SettingValues } from "../config/table.ts";
import { UsageError, UserError } from "../errors.ts";
import type { BundlePolicy } from "./bundles.ts";
import { Coordinator } from "./coordinator.ts";
import type { ArtifactSettings } from "./artifact-routes.ts";
import { JobsApi } from "./jobs-api.ts";
import { handler } from "./routes.ts";
import { parseListen } from "../cluster/listen.ts";
export { parseListen } from "../cluster/listen.ts";
import { Sessions } from "./dashboard/session.ts";
import { ServerStore } from "./store.ts";
import { SqliteDatabase } from "./db/sqlite.ts";
import { PostgresDatabase } from "./db/postgres.ts";
import { type Database, DatabaseDown } from "./db/sql.ts";
import { migrate } from "./db/migrations.ts";
import { SecretSeal } from "./held-secrets.ts";
import { hostname } from "node:os";
import { lockHolder, type Release, tryLock } from "../core/lock.ts";
import { CredentialCache } from "./credential-cache.ts";

/** `gpulayer server`: the store, the coordinator and the HTTP API, started together. */

export interface ServerSettings {
  hostname: string;
  port: number;
  heartbeatSeconds: number;
  lostSeconds: number;
  leaseSeconds: number;
  maxAttempts: number;
  maxBodyBytes: number;
  /** coordinator.max_job: a job's or prepare's request. */
  maxJobBytes: number;
  bundles: BundlePolicy;
  /** What one uploaded bundle may hold. */
  bundleLimits: BundleLimits;
  artifacts: ArtifactSettings;
  /** coordinator.metrics_token: good for GET /metrics only. */
  metricsToken: string | null;
  /** coordinator.database: a PostgreSQL URL (replicas), or null for SQLite in the server's home. */
  database: string | null;
  /** coordinator.files: bundles and artifacts; null for the server's home. */
  files: string | null;
}

/** How often the server looks for bundles to remove (and once when it starts). */
export const BUNDLE_CHECK_MS = 5 * 60_000;

/** From the coordinator.* and bundle.* settings. */
/** The lease outlasts the lost window: a worker is first seen as lost (no new work), then, after the lease, loses its jobs. */
function lease(values: SettingValues): number {
  if (values["coordinator.worker_lease"] <= values["coordinator.worker_lost"]) throw new UsageError(`coordinator.worker_lease (GPULAYER_WORKER_LEASE) must be longer than coordinator.worker_lost (GPULAYER_WORKER_LOST_SECONDS)`);
  return values["coordinator.worker_lease"] / 1000;
}

export function serverSettings(values: SettingValues): ServerSettings {
  // A job's request is a JSON body: a job limit past the body limit would never be the one that refuses.
  if (values["coordinator.max_job"] > values["coordinator.max_body"]) throw new UsageError(`coordinator.max_job (GPULAYER_MAX_JOB_BYTES) must not be more than coordinator.max_body (GPULAYER_MAX_BODY_BYTES): a job's request is a JSON body`);
  const positive = (name: "coordinator.heartbeat" | "coordinator.worker_lost" | "coordinator.worker_lease" | "coordinator.max_body" | "coordinator.max_job") => {
    if (values[name] <= 0) throw new UsageError(`${name} must be more than 0`);
    return values[name];
  };
  return {
    ...parseListen(values["coordinator.listen"]),
    heartbeatSeconds: positive("coordinator.heartbeat") / 1000,
    lostSeconds: positive("coordinator.worker_lost") / 1000,
    leaseSeconds: lease(values),
    maxAttempts: values["coordinator.job_max_attempts"],
    maxBodyBytes: positive("coordinator.max_body"),
    maxJobBytes: positive("coordinator.max_job"),
    bundles: { retentionMs: values["coordinator.bundle_retention"], maxBytes: values["coordinator.bundles_max_size"] },
    bundleLimits: bundleLimits(values),
    artifacts: { maxBytes: values["coordinator.artifacts_max_size"], share: values["coordinator.share_envs"], sharedFiles: Boolean(values["coordinator.database"]) },
    metricsToken: values["coordinator.metrics_token"] ?? null,
    database: values["coordinator.database"] ?? null,
    files: values["coordinator.files"] ?? null,
  };
}

export interface TokenInfo {
  token: string;
  /** Set only when the token was made just now (first start): the one time it is shown. */
  generated: boolean;
  file: string | null;
  /** A token kept in the home that the given one overrides (another token: its clients and workers get 401). */
  overrides: string | null;
}

/** --token or GPULAYER_TOKEN; else the one kept in the server's home (made, 0600, on first start). */
export function serverToken(dir: string, given: string | undefined): TokenInfo {
  const file = join(dir, "token");
  if (given !== undefined) {
    if (given.length < 16) throw new UsageError("the server token must be at least 16 characters (leave --token out and one is generated)");
    const kept = existsSync(file) ? readFileSync(file, "utf8").trim() : "";
    return { token: given, generated: false, file: null, overrides: kept && kept !== given ? file : null };
  }
  if (existsSync(file)) {
    const token = readFileSync(file, "utf8").trim();
    if (token) return { token, generated: false, file, overrides: null };
  }
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const token = `gpl_${Buffer.from(crypto.getRandomValues(new Uint8Array(24))).toString("base64url")}`;
  writeFileSync(file, `${token}\n`, { mode: 0o600 });
  chmodSync(file, 0o600);
  return { token, generated: true, file, overrides: null };
}

export interface RunningServer {
  url: string;
  port: number;
  /** This process among the replicas on one database (host, pid and a random part). */
  replica: string;
  /** The database, credentials left out. */
  database: string;
  stop(): Promise<void>;
}

/** The server's database: SQLite in its home, or the PostgreSQL of coordinator.database; migrated before use. */
export async function openDatabase(dir: string, url: string | null): Promise<Database> {
  const db: Database = url ? new PostgresDatabase(url) : new SqliteDatabase(join(dir, "server.db"));
  try {
    await migrate(db);
  } catch (error) {
    await db.close().catch(() => {});
    if (error instanceof DatabaseDown) throw new UserError(`cannot reach the server's database at ${db.where}: ${error.message}`);
    throw new UserError(`the server's database at ${db.where}: ${(error as Error).message}`);
  }
  return db;
}

/**
 * A worker's credential found is taken as found this long at most (credential-cache.ts), where a wake-up that would
 * drop it is lost. It bounds only what a request may skip looking up: every change checks the credential again under
 * the worker's row lock, so a replaced one gets nothing done meanwhile.
 */
const CREDENTIAL_KEEP_MS = 5_000;
/** How often a replica checks that its database answers (and says so at /v1/health). */
const DATABASE_CHECK_MS = 2_000;

/** Whether the database answers: a replica that lost it takes no work (503, so clients and workers move on) until it answers again. */
export class DatabaseHealth {
  error: string | null = null;
  /** Told of each loss (the coordinator then counts no worker's silence from before the database is back). */
  onDown: () => void = () => {};
  constructor(private readonly log: (message: string) => void) {}
  down(error: unknown): void {
    const message = error instanceof Error ? error.message : String(error);
    if (this.error === null) this.log(`lost the database (${message}): taking no work until it answers again`);
    this.error = message;
    this.onDown();
  }
  up(): void {
    if (this.error !== null) this.log("the database answers again: taking work");
    this.error = null;
  }
}

/** A replica is counted as serving while it has been heard from this recently (it writes its row at every database check). */
const REPLICA_LIVE_MS = 5 * DATABASE_CHECK_MS;

const tokenFingerprint = (token: string) => contentHash(`gpulayer replica token\0${token}`);

/** Replicas with different tokens would each refuse the others' clients and workers (401 is not failed over): the second one is refused. */
async function refuseOtherToken(db: Database, token: string): Promise<void> {
  const others = await db.all<{ id: string; token: string; last_seen: number }>("SELECT id, token, last_seen FROM replicas WHERE last_seen > ?", Date.now() - REPLICA_LIVE_MS);
  const other = others.find((r) => r.token !== tokenFingerprint(token));
  if (other) throw new UserError(`replica ${other.id} on ${db.where} (heard from ${((Date.now() - Number(other.last_seen)) / 1000).toFixed(1)} s ago) uses another token: every replica needs the same one (--token-file, --token or GPULAYER_TOKEN)`);
}

/**
 * The server's own token may do everything: one that is also a named token (a user's token file exported in the
 * shell that starts the server) would make that user's or worker's token all-powerful, and revoking it would
 * change nothing. Refused before anything is served.
 */
async function refuseNamedToken(db: Database, token: string, origin: TokenOrigin): Promise<void> {
  const named = await db.get<{ name: string; role: string }>("SELECT name, role FROM tokens WHERE hash = ?", contentHash(token));
  if (!named) return;
  const what = `the ${named.role} token named ${named.name}: the server's own token may do everything, so it must be no named token`;
  if (origin.kept) throw new UserError(`the server's token kept in ${origin.text} is ${what} (remove that file and start again: a new one is made)`);
  throw new UserError(`the server's token (${origin.text}) is ${what} (leave out ${origin.text} to use the one kept in the server's home)`);
}

/** Where the server's token came from, for a refusal to name: a flag, variable or config key, or the file kept in its home. */
export interface TokenOrigin {
  text: string;
  kept: boolean;
}

/** This home's server lock, or a refusal naming the server that holds it (a dead holder's lock is broken). */
async function ownHome(dir: string): Promise<Release> {
  const path = join(dir, "server");
  const release = await tryLock(path);
  if (release) return release;
  const pid = lockHolder(path);
  throw new UserError(`another gpulayer server${pid ? ` (pid ${pid})` : ""} keeps its state in ${dir}: one server per home on SQLite (stop it, or give this one its own GPULAYER_HOME; replicas share PostgreSQL: --database)`);
}

/** Beside the home's state: which database its server keeps its state in (so `gpulayer server token` run in this home finds it, or says where to look). */
export const DATABASE_MARKER = "database";

export async function startServer(dir: string, token: string, settings: ServerSettings, sink: (message: string) => void, tokenOrigin: TokenOrigin): Promise<RunningServer> {
  // One line each, whatever a job's, a task's or a worker's name holds: no line break, no escape code reaches the log.
  const log = (message: string) => sink(printable(message));
  const replicas = settings.database !== null;
  // On SQLite the home is one server's: a second would share its state and neither would know of the other's workers.
  const homeLock = replicas ? null : await ownHome(dir);
  const db = await openDatabase(dir, settings.database).catch(async (error) => {
    await homeLock?.();
    throw error;
  });
  try {
    await refuseNamedToken(db, token, tokenOrigin);
  } catch (error) {
    await db.close();
    await homeLock?.();
    throw error;
  }
  const replica = `${hostname()}-${process.pid}-${Buffer.from(crypto.getRandomValues(new Uint8Array(3))).toString("hex")}`;
  if (replicas) {
    let unsafe: string[];
    try {
      await refuseOtherToken(db, token);
      unsafe = db instanceof PostgresDatabase ? await db.unsafeSettings() : [];
    } catch (error) {
      await db.close();
      throw error;
    }
    if (unsafe.length) log(`warning: the database runs with ${unsafe.join(" and ")}: if it crashes, jobs it answered for can be lost or run twice (the README says what the coordinator needs from PostgreSQL)`);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    writeFileSync(join(dir, DATABASE_MARKER), `${db.where}\n`, { mode: 0o600 });
  } else rmSync(join(dir, DATABASE_MARKER), { force: true });
  const store = new ServerStore(db, settings.files ?? dir);
  const health = new DatabaseHealth(log);
  const coord = new Coordinator(
    store,
    {
      heartbeatSeconds: settings.heartbeatSeconds,
      lostSeconds: settings.lostSeconds,
      leaseSeconds: settings.leaseSeconds,
      maxAttempts: settings.maxAttempts,
      ...(replicas ? { seal: new SecretSeal(token), publish: (keys: string[]) => db.publish(keys) } : {}),
    },
    log,
    (error) => (error instanceof DatabaseDown ? health.down(error) : log(`sweep failed: ${(error as Error).stack ?? error}`)),
  );
  health.onDown = () => coord.lostDatabase();
  const credentials = new CredentialCache(CREDENTIAL_KEEP_MS);
  coord.notify.hear((key) => credentials.heard(key));
  if (replicas) await db.subscribe((key) => coord.notify.wake(key));
  // The database check is also this replica's sign of life among the replicas.
  const check = () => (replicas ? db.run("UPDATE replicas SET last_seen = ? WHERE id = ?", Date.now(), replica).then(() => {}) : db.ping());
  const checker = setInterval(() => void check().then(() => health.up(), (e) => health.down(e)), DATABASE_CHECK_MS);
  const jobs = new JobsApi(coord);
  const limits = settings.bundleLimits;
  const cleanBundles = async () => {
    try {
      const r = await store.exclusive((s) => s.bundles.sweep(settings.bundles, Date.now(), replicas));
      if (!r.removed.length && !r.strays) return;
      const freed = r.removed.reduce((n, b) => n + b.bytes, 0);
      const expired = r.removed.filter((b) => b.why === "expired").length;
      const why = [expired && `${expired} unused past GPULAYER_BUNDLE_RETENTION (${formatMs(settings.bundles.retentionMs)})`, r.removed.length - expired && `${r.removed.length - expired} over GPULAYER_BUNDLE_MAX_SIZE`, r.strays && `${r.strays} left from interrupted uploads`].filter(Boolean).join(", ");
      log(`removed ${r.removed.length + r.strays} bundle file(s) (${why}), ${formatBytes(freed)} freed, ${formatBytes(r.keptBytes)} kept`);
    } catch (error) {
      log(`bundle cleanup failed: ${(error as Error).message}`);
    }
  };
  await cleanBundles();
  const janitor = setInterval(() => void cleanBundles(), BUNDLE_CHECK_MS);
  janitor.unref();
  const closeAll = async () => {
    clearInterval(janitor);
    clearInterval(checker);
    coord.close();
    if (replicas) await db.run("DELETE FROM replicas WHERE id = ?", replica).catch(() => {});
    await db.close();
    await homeLock?.();
  };
  let server: ReturnType<typeof Bun.serve>;
  // Once stopping, a request still in flight (a long poll the stop cut off) meets the closed database: that is the stop, not an error.
  let stopping = false;
  try {
    server = Bun.serve({
      hostname: settings.hostname,
      port: settings.port,
      // Long polls hold a request open for up to 30 s.
      idleTimeout: 120,
      maxRequestBodySize: Math.max(limits.maxBytes, settings.maxBodyBytes, settings.artifacts.maxBytes) + 1024 * 1024,
      fetch: handler({
        coord,
        jobs,
        token,
        limits,
        maxBodyBytes: settings.maxBodyBytes,
        maxJobBytes: settings.maxJobBytes,
        artifacts: settings.artifacts,
        sessions: new Sessions(db),
        credentials,
        metricsToken: settings.metricsToken,
        replica,
        health,
        onError: (e) => (stopping ? undefined : e instanceof DatabaseDown ? health.down(e) : log(`internal error: ${(e as Error).stack ?? e}`)),
      }),
    });
  } catch (error) {
    await closeAll();
    throw new UsageError(`cannot listen on ${settings.hostname}:${settings.port}: ${(error as Error).message}`);
  }
  const host = settings.hostname.includes(":") ? `[${settings.hostname}]` : settings.hostname;
  if (replicas) {
    // Rows of replicas long gone (killed, never said goodbye) go as new ones come.
    await db.run("DELETE FROM replicas WHERE last_seen < ?", Date.now() - 3_600_000);
    await db.run("INSERT INTO replicas (id, token, url, started, last_seen) VALUES (?, ?, ?, ?, ?)", replica, tokenFingerprint(token), `http://${host}:${server.port}`, Date.now(), Date.now());
  }
  return {
    url: `http://${host}:${server.port}`,
    port: server.port!,
    replica,
    database: db.where,
    async stop() {
      stopping = true;
      await server.stop(true);
      await closeAll();
    },
  };
}

function formatMs(ms: number): string {
  if (ms === 0) return "0 s";
  if (ms % 86_400_000 === 0) return `${ms / 86_400_000} d`;
  if (ms % 3_600_000 === 0) return `${ms / 3_600_000} h`;
  if (ms % 60_000 === 0) return `${ms / 60_000} min`;
  return `${ms / 1000} s`;
}
