import { parseDuration, parseSize, SIZE_HINT } from "../core/units.ts";

/**
 * One parser per kind of value a setting can hold, whatever its source: a
 * flag, a GPULAYER_* variable (always text) or config.yaml (text, number or
 * boolean). `parse` returns the typed value, or a string saying what is wrong.
 */
export interface Kind<T> {
  /** For the settings table in the README and `gpulayer config`: "size", "duration", ... */
  name: string;
  parse(raw: string | number | boolean): T | { problem: string };
  /** How a value is shown back (sizes and durations as people write them, secrets hidden). */
  show(value: T): string;
  /** Its form in `gpulayer config --json`: sizes in bytes, durations in seconds, secrets hidden. */
  json?(value: T): unknown;
}

export const isProblem = (v: unknown): v is { problem: string } => typeof v === "object" && v !== null && "problem" in v;

const text = (raw: string | number | boolean): string => String(raw).trim();

export const size: Kind<number> = {
  name: "size",
  parse(raw) {
    if (typeof raw === "boolean") return { problem: `not a size (expected ${SIZE_HINT})` };
    if (typeof raw === "string" && /^\s*-/.test(raw)) return { problem: "a size cannot be negative" };
    const n = parseSize(typeof raw === "number" ? raw : raw.trim());
    return n === null ? { problem: `not a size (expected ${SIZE_HINT})` } : n;
  },
  show(n) {
    for (const [unit, scale] of [["T", 1024 ** 4], ["G", 1024 ** 3], ["M", 1024 ** 2], ["K", 1024]] as const) if (n >= scale && n % scale === 0) return `${n / scale}${unit}`;
    return String(n);
  },
};

/** Milliseconds; a bare number is seconds. `maxDays`: a timer's limit, or an age's. */
const durationUpTo = (maxDays: number): Kind<number> => ({
  name: "duration",
  parse(raw) {
    if (typeof raw === "boolean") return { problem: "not a duration (expected e.g. 30s, 10m, 2h, 1d; a bare number is seconds)" };
    if (/^\s*-/.test(String(raw))) return { problem: "a duration cannot be negative" };
    const ms = parseDuration(String(raw));
    if (ms === null) return { problem: "not a duration (expected e.g. 30s, 10m, 2h, 1d; a bare number is seconds)" };
    return ms > maxDays * 86_400_000 ? { problem: `too long: at most ${maxDays}d` } : ms;
  },
  show: (ms) => (ms % 3_600_000 === 0 && ms ? `${ms / 3_600_000}h` : ms % 60_000 === 0 && ms ? `${ms / 60_000}m` : ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`),
  json: (ms) => ms / 1000,
});

/** What a timer waits: 24 days at most, as timers count milliseconds in 31 bits (a longer one fires at once). */
export const duration: Kind<number> = durationUpTo(24);

/** An age things are kept for (compared with timestamps, never a timer): up to 100 years. */
export const age: Kind<number> = durationUpTo(36_500);

/** A whole number of at least `min`. */
export const count = (min: number): Kind<number> => ({
  name: "count",
  parse(raw) {
    const s = text(raw);
    if (typeof raw === "boolean" || !/^-?\d+$/.test(s)) return { problem: `not a whole number (expected ${min} or more)` };
    const n = Number(s);
    return n < min ? { problem: `must be ${min} or more` } : n;
  },
  show: String,
});

export const choice = <T extends string>(...values: T[]): Kind<T> => ({
  name: values.join(" | "),
  parse(raw) {
    const s = text(raw);
    return (values as string[]).includes(s) ? (s as T) : { problem: `must be ${values.slice(0, -1).join(", ")} or ${values.at(-1)}` };
  },
  show: String,
});

export const word: Kind<string> = {
  name: "text",
  parse(raw) {
    const s = text(raw);
    if (!s) return { problem: "must not be empty" };
    // eslint-disable-next-line no-control-regex
    if (/[\u0000-\u001f\u007f]/.test(s)) return { problem: "must not hold control characters" };
    return s;
  },
  show: String,
};

/** Free text that may be empty (extra engine options). */
export const anyText: Kind<string> = {
  name: "text",
  parse: (raw) => (typeof raw === "boolean" ? { problem: "must be text" } : String(raw)),
  show: (s) => JSON.stringify(s),
};

export const boolean: Kind<boolean> = {
  name: "boolean",
  parse(raw) {
    if (typeof raw === "boolean") return raw;
    const s = text(raw).toLowerCase();
    if (["1", "true", "yes", "on"].includes(s)) return true;
    if (["0", "false", "no", "off", ""].includes(s)) return false;
    return { problem: "must be true or false (or 1, 0)" };
  },
  show: String,
};

/** One server URL, normalized: http(s), no credentials in it (the token goes apart). */
function oneServerUrl(s: string): string | { problem: string } {
  let parsed: URL;
  try {
    parsed = new URL(/^[a-z][a-z0-9+.-]*:\/\//i.test(s) ? s : `http://${s}`);
  } catch {
    return { problem: "not a URL (expected http://HOST:PORT)" };
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") return { problem: "expected http:// or https://" };
  if (parsed.username || parsed.password) return { problem: "put the token in --token or GPULAYER_TOKEN, not in the URL" };
  return `${parsed.protocol}//${parsed.host}${parsed.pathname.replace(/\/+$/, "")}`;
}

/**
 * A server: one URL, or several replicas of it separated by commas (tried in
 * that order, the next when one stops answering). The value is the
 * normalized URLs joined with ","; serverUrls splits it again.
 */
export const serverUrl: Kind<string> = {
  name: "url",
  parse(raw) {
    const parts = text(raw).split(",").map((p) => p.trim());
    if (parts.length === 1) return oneServerUrl(parts[0]!);
    const urls: string[] = [];
    for (const part of parts) {
      if (!part) return { problem: "an empty URL in the list (two commas in a row, or one at an end)" };
      const url = oneServerUrl(part);
      if (isProblem(url)) return { problem: `${part}: ${url.problem}` };
      if (urls.includes(url)) return { problem: `${url} is in the list twice` };
      urls.push(url);
    }
    return urls.join(",");
  },
  show: String,
};

/** The URLs of a `serverUrl` value, in the order they are tried. */
export const serverUrls = (value: string): string[] => value.split(",").map((u) => u.trim()).filter(Boolean);

/** A PostgreSQL URL (postgres://USER:PASSWORD@HOST:PORT/DB); shown without its password. */
export const databaseUrl: Kind<string> = {
  name: "database url",
  parse(raw) {
    const s = text(raw);
    let parsed: URL;
    try {
      parsed = new URL(s);
    } catch {
      return { problem: "not a URL (expected postgres://USER:PASSWORD@HOST:PORT/DATABASE)" };
    }
    if (parsed.protocol !== "postgres:" && parsed.protocol !== "postgresql:") return { problem: "expected postgres:// (PostgreSQL; leave it unset for SQLite in the server's home)" };
    if (!parsed.hostname) return { problem: "names no host (expected postgres://USER:PASSWORD@HOST:PORT/DATABASE)" };
    return s;
  },
  show: (s) => hidePassword(s),
  json: (s) => hidePassword(s),
};

export function hidePassword(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    return u.toString();
  } catch {
    // Not a URL: a password could only sit before an @.
    return url.includes("@") ? "***" : url;
  }
}

export const secret: Kind<string> = {
  name: "secret",
  parse: (raw) => word.parse(raw),
  show: () => "***",
  json: () => "***",
};

/** A duration that must be more than 0 (a heartbeat every 0 s would be a busy loop). */
export const positiveDuration: Kind<number> = {
  ...duration,
  parse(raw) {
    const ms = duration.parse(raw);
    return typeof ms === "number" && ms <= 0 ? { problem: "must be more than 0" } : ms;
  },
};
