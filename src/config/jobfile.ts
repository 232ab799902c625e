import { existsSync, readFileSync, statSync } from "node:fs";
import { basename } from "node:path";
import * as v from "valibot";
import { validRange } from "@renovatebot/pep440";
import { parse as parseYaml } from "yaml";
import { UsageError } from "../errors.ts";

/** The job file, exactly as DESIGN.md shows it. Strict: an unknown key is an error naming its path. */
const NonEmpty = v.pipe(v.string(), v.minLength(1, "must not be empty"));

export const JobFileSchema = v.strictObject({
  name: v.optional(NonEmpty),
  command: v.optional(v.union([NonEmpty, v.pipe(v.array(v.string()), v.minLength(1, "must not be empty"))], "must be a string or a list of strings")),
  workdir: v.optional(NonEmpty),
  env: v.optional(v.record(v.pipe(v.string(), v.regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "is not a valid variable name")), v.union([v.string(), v.number(), v.boolean()], "must be a string, number or boolean"))),
  environment: v.optional(
    v.strictObject({
      requirements: v.optional(v.union([NonEmpty, v.array(NonEmpty)], "must be a file path or a list of requirement specs")),
      python: v.optional(NonEmpty),
      index_url: v.optional(NonEmpty),
      extra_index_urls: v.optional(v.array(NonEmpty)),
      find_links: v.optional(v.array(NonEmpty)),
      image: v.optional(NonEmpty),
    }),
  ),
  resources: v.optional(
    v.strictObject({
      gpus: v.optional(v.pipe(v.number("must be a number"), v.integer("must be a whole number"), v.minValue(0, "must be 0 or more"))),
      frameworks: v.optional(v.record(v.string(), v.pipe(v.string("must be a version specifier string"), v.check((s) => s === "" || s === "*" || validRange(s), "is not a valid PEP 440 specifier")))),
    }),
  ),
});

export type JobFile = v.InferOutput<typeof JobFileSchema>;

function describeIssue(issue: v.BaseIssue<unknown>): string {
  const path = v.getDotPath(issue) ?? "";
  if (issue.expected === "never" && issue.path?.length) return `${path}: unknown key`;
  if (issue.kind === "schema" && issue.type === "object" && issue.received === "undefined") return `${path}: is required`;
  const message = /^Invalid (type|key)/.test(issue.message) ? `expected ${issue.expected}, got ${issue.received}` : issue.message;
  return path ? `${path}: ${message}` : message;
}

/** Validate parsed data; the first problem becomes one line naming the key path. */
export function validateJobFile(data: unknown, source: string): JobFile {
  if (data === null || typeof data !== "object" || Array.isArray(data)) throw new UsageError(`${source}: a job file must be a mapping of keys (name, command, environment, ...)`);
  const result = v.safeParse(JobFileSchema, data);
  if (!result.success) throw new UsageError(`${source}: ${describeIssue(result.issues[0])}`);
  return result.output;
}

export function loadJobFile(path: string): JobFile {
  if (!existsSync(path) || !statSync(path).isFile()) throw new UsageError(`job file not found: ${path}`);
  const text = readFileSync(path, "utf8");
  let data: unknown;
  try {
    data = path.endsWith(".json") ? JSON.parse(text) : parseYaml(text);
  } catch (error) {
    throw new UsageError(`${basename(path)}: not valid ${path.endsWith(".json") ? "JSON" : "YAML"}: ${(error as Error).message.split("\n")[0]}`);
  }
  return validateJobFile(data, basename(path));
}
