import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { formatBytes } from "../ui/output.ts";
import { bundleLimits } from "../cluster/bundle.ts";
import { UsageError } from "../errors.ts";
import { parseDuration, parseSize, SIZE_HINT } from "../gc/units.ts";
import type { BundlePolicy } from "./bundles.ts";
import { Coordinator } from "./coordinator.ts";
import { JobsApi } from "./jobs-api.ts";
import { handler } from "./routes.ts";
import { ServerStore } from "./store.ts";

/** `gpulayer server`: the store, the coordinator and the HTTP API, started together. */

export interface ServerSettings {
  hostname: string;
  port: number;
  heartbeatSeconds: number;
  lostSeconds: number;
  maxAttempts: number;
  maxBodyBytes: number;
  bundles: BundlePolicy;
}

/** How often the server looks for bundles to remove (and once when it starts). */
export const BUNDLE_CHECK_MS = 5 * 60_000;

function positive(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const n = Number(raw);
  if (!Number.isFinite(n) || n <= 0) throw new UsageError(`${name} must be a positive number, not ${JSON.stringify(raw)}`);
  return n;
}

/** GPULAYER_BUNDLE_RETENTION: `30m`, `2h`, `1d`, `0`, or seconds; default 24 h. */
export function bundleRetentionMs(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.GPULAYER_BUNDLE_RETENTION;
  if (raw === undefined || raw === "") return 24 * 3_600_000;
  const ms = parseDuration(raw);
  if (ms === null) throw new UsageError(`GPULAYER_BUNDLE_RETENTION must be a duration such as 30m, 2h, 1d or 0 (a bare number is seconds), not ${JSON.stringify(raw)}`);
  return ms;
}

/** GPULAYER_BUNDLE_MAX_SIZE: the most the uploaded bundles may take together; default 10G. */
export function bundleMaxBytes(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.GPULAYER_BUNDLE_MAX_SIZE;
  if (raw === undefined || raw === "") return 10 * 1024 ** 3;
  const n = parseSize(raw);
  if (n === null) throw new UsageError(`GPULAYER_BUNDLE_MAX_SIZE must be ${SIZE_HINT}, not ${JSON.stringify(raw)}`);
  return n;
}

/** HOST:PORT, :PORT or PORT (default 127.0.0.1:7070). */
export function parseListen(value: string | undefined): { hostname: string; port: number } {
  const text = value ?? "127.0.0.1:7070";
  const m = /^(?:\[?([^\]]*?)\]?:)?(\d{1,5})$/.exec(text);
  const port = Number(m?.[2]);
  if (!m || port > 65535) throw new UsageError(`--listen ${text}: expected HOST:PORT (e.g. 0.0.0.0:7070)`);
  return { hostname: m[1] || "127.0.0.1", port };
}

export function serverSettings(listen: string | undefined, env: NodeJS.ProcessEnv = process.env): ServerSettings {
  return {
    ...parseListen(listen),
    heartbeatSeconds: positive(env, "GPULAYER_HEARTBEAT_SECONDS", 2),
    lostSeconds: positive(env, "GPULAYER_WORKER_LOST_SECONDS", 30),
    maxAttempts: Math.floor(positive(env, "GPULAYER_JOB_MAX_ATTEMPTS", 3)),
    maxBodyBytes: Math.floor(positive(env, "GPULAYER_MAX_BODY_BYTES", 8 * 1024 * 1024)),
    bundles: { retentionMs: bundleRetentionMs(env), maxBytes: bundleMaxBytes(env) },
  };
}

export interface TokenInfo {
  token: string;
  /** Set only when the token was made just now (first start): the one time it is shown. */
  generated: boolean;
  file: string | null;
}

/** --token or GPULAYER_TOKEN; else the one kept in the server's home (made, 0600, on first start). */
export function serverToken(dir: string, given: string | undefined): TokenInfo {
  if (given !== undefined) {
    if (given.length < 16) throw new UsageError("the server token must be at least 16 characters (leave --token out and one is generated)");
    return { token: given, generated: false, file: null };
  }
  const file = join(dir, "token");
  if (existsSync(file)) {
    const token = readFileSync(file, "utf8").trim();
    if (token) return { token, generated: false, file };
  }
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const token = `gpl_${Buffer.from(crypto.getRandomValues(new Uint8Array(24))).toString("base64url")}`;
  writeFileSync(file, `${token}\n`, { mode: 0o600 });
  chmodSync(file, 0o600);
  return { token, generated: true, file };
}

export interface RunningServer {
  url: string;
  port: number;
  stop(): Promise<void>;
}

export function startServer(dir: string, token: string, settings: ServerSettings, log: (message: string) => void, env: NodeJS.ProcessEnv = process.env): RunningServer {
  const store = new ServerStore(dir);
  const coord = new Coordinator(store, { heartbeatSeconds: settings.heartbeatSeconds, lostSeconds: settings.lostSeconds, maxAttempts: settings.maxAttempts }, log);
  const jobs = new JobsApi(coord);
  const limits = bundleLimits(env);
  const cleanBundles = () => {
    try {
      const r = store.bundles.sweep(settings.bundles);
      if (!r.removed.length && !r.strays) return;
      const freed = r.removed.reduce((n, b) => n + b.bytes, 0);
      const expired = r.removed.filter((b) => b.why === "expired").length;
      const why = [expired && `${expired} unused past GPULAYER_BUNDLE_RETENTION (${formatMs(settings.bundles.retentionMs)})`, r.removed.length - expired && `${r.removed.length - expired} over GPULAYER_BUNDLE_MAX_SIZE`, r.strays && `${r.strays} left from interrupted uploads`].filter(Boolean).join(", ");
      log(`removed ${r.removed.length + r.strays} bundle file(s) (${why}), ${formatBytes(freed)} freed, ${formatBytes(r.keptBytes)} kept`);
    } catch (error) {
      log(`bundle cleanup failed: ${(error as Error).message}`);
    }
  };
  cleanBundles();
  const janitor = setInterval(cleanBundles, BUNDLE_CHECK_MS);
  janitor.unref();
  let server: ReturnType<typeof Bun.serve>;
  try {
    server = Bun.serve({
      hostname: settings.hostname,
      port: settings.port,
      // Long polls hold a request open for up to 30 s.
      idleTimeout: 120,
      maxRequestBodySize: Math.max(limits.maxBytes, settings.maxBodyBytes) + 1024 * 1024,
      fetch: handler({ coord, jobs, token, limits, maxBodyBytes: settings.maxBodyBytes, onError: (e) => log(`internal error: ${(e as Error).stack ?? e}`) }),
    });
  } catch (error) {
    clearInterval(janitor);
    coord.close();
    store.close();
    throw new UsageError(`cannot listen on ${settings.hostname}:${settings.port}: ${(error as Error).message}`);
  }
  const host = settings.hostname.includes(":") ? `[${settings.hostname}]` : settings.hostname;
  return {
    url: `http://${host}:${server.port}`,
    port: server.port!,
    async stop() {
      clearInterval(janitor);
      coord.close();
      await server.stop(true);
      store.close();
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
