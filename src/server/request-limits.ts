import type { TaskEventIn } from "../cluster/protocol.ts";
import { formatBytes } from "../core/units.ts";
import { HttpFail } from "./http-fail.ts";

/**
 * What one request may hold beyond coordinator.max_body, so that none costs
 * the server more than a bounded, linear amount of work: a job's request
 * (coordinator.max_job; its tasks, at most 1,000, are in schemas.ts), and an
 * event a worker reports. Each refusal is one line naming the limit.
 */

/** The most one event keeps, as JSON: phases and messages, never output (which goes as output). */
export const MAX_EVENT_BYTES = 64 * 1024;
/** A longer string in an event keeps its first this many characters (a build's long error stays readable). */
const EVENT_STRING_CHARS = 16 * 1024;
/** Nesting an event's data may have: its own values are flat; a deep one is refused rather than walked. */
const EVENT_DEPTH = 16;

/** How deep a JSON body may nest: the API's documents are a few levels deep; parsing 8 MB of `[[[[…` took over a second. */
export const MAX_JSON_DEPTH = 64;

/** Whether JSON text nests deeper than `max` (brackets outside strings counted, in one pass over the bytes, before it is parsed). */
export function nestsDeeper(raw: Uint8Array, max = MAX_JSON_DEPTH): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < raw.length; i++) {
    const c = raw[i]!;
    if (inString) {
      if (c === 0x5c) i++; // a backslash: the next byte is escaped
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return true;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return false;
}

/** The 413 for a job request past coordinator.max_job: by its declared length, or as soon as what arrived passes the limit. */
export function jobTooLarge(limit: number, declared: number | null): HttpFail {
  return new HttpFail(413, `job request too large: ${declared ? `${declared}` : `more than ${limit}`} bytes, over the limit of ${formatBytes(limit)} (coordinator.max_job, GPULAYER_MAX_JOB_BYTES)`);
}

function cut(value: unknown, depth: number, at: string): unknown {
  if (typeof value === "string") return value.length <= EVENT_STRING_CHARS ? value : `${value.slice(0, EVENT_STRING_CHARS)}… [${value.length - EVENT_STRING_CHARS} more characters cut by the server]`;
  if (value === null || typeof value !== "object") return value;
  if (depth >= EVENT_DEPTH) throw new HttpFail(400, `${at}: nested deeper than ${EVENT_DEPTH} levels`);
  if (Array.isArray(value)) return value.map((v) => cut(v, depth + 1, at));
  return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, cut(v, depth + 1, at)]));
}

/** A worker's events with their long strings cut; one still over MAX_EVENT_BYTES refuses the batch (413; the worker says so and goes on). */
export function boundEvents(events: TaskEventIn[]): TaskEventIn[] {
  return events.map((e, i) => {
    const at = `events[${i}] (${e.type})`;
    const data = cut(e.data, 0, at) as Record<string, unknown>;
    const bytes = Buffer.byteLength(JSON.stringify(data));
    if (bytes > MAX_EVENT_BYTES) throw new HttpFail(413, `${at}: ${bytes} bytes, over the limit of ${formatBytes(MAX_EVENT_BYTES)} an event may hold`);
    return { ...e, data };
  });
}
