import { closeSync, constants, fstatSync, openSync, readSync, type Stats, statSync } from "node:fs";
import { basename } from "node:path";
import * as v from "valibot";
import { validRange } from "@renovatebot/pep440";
import { UsageError } from "../errors.ts";
import { positiveDuration } from "./kinds.ts";
import { parseJobYaml } from "./yaml.ts";

/** The job file, exactly as DESIGN.md shows it. Strict: an unknown key is an error naming its path. */
const NonEmpty = v.pipe(v.string(), v.minLength(1, "must not be empty"));

const Command = v.union([NonEmpty, v.pipe(v.array(v.string()), v.minLength(1, "must not be empty"))], "must be a string or a list of strings");
const Env = v.record(v.pipe(v.string(), v.regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "is not a valid variable name")), v.union([v.string(), v.number(), v.boolean()], "must be a string, number or boolean"));

const Environment = v.strictObject({
  requirements: v.optional(v.union([NonEmpty, v.array(NonEmpty)], "must be a file path or a list of requirement specs")),
  python: v.optional(NonEmpty),
  conda: v.optional(NonEmpty),
  index_url: v.optional(NonEmpty),
  extra_index_urls: v.optional(v.array(NonEmpty)),
  find_links: v.optional(v.array(NonEmpty)),
  image: v.optional(NonEmpty),
  /** A uv project's folder (pyproject.toml + uv.lock), relative to the workdir: the lock is the environment. */
  project: v.optional(NonEmpty),
  groups: v.optional(v.array(NonEmpty)),
  extras: v.optional(v.array(NonEmpty)),
  /** Packages built after the rest of the env, with its packages and the worker's importable (torch extensions). */
  no_build_isolation: v.optional(v.array(NonEmpty)),
  prepare_timeout: v.optional(v.pipe(v.union([v.string(), v.number()], "must be a duration such as 30m or a number of seconds"), v.check((d) => typeof positiveDuration.parse(d) === "number", "must be a duration of more than 0, such as 90s, 30m or 2h"))),
});

const Resources = v.strictObject({
  gpus: v.optional(v.pipe(v.number("must be a number"), v.integer("must be a whole number"), v.minValue(0, "must be 0 or more"))),
  frameworks: v.optional(v.record(v.string(), v.pipe(v.string("must be a version specifier string"), v.check((s) => s === "" || s === "*" || validRange(s), "is not a valid PEP 440 specifier")))),
});

/** Why a declared output cannot be one (null when it can): a path inside the task's folder, never out of it. */
export function outputPathProblem(p: string): string | null {
  if (!p.length) return "must not be empty";
  if (p.startsWith("/")) return "must be a path relative to the task's folder, not an absolute one";
  if (p.split("/").includes("..")) return "must stay inside the task's folder (no `..`)";
  if (p.includes("\0")) return "must not hold a NUL character";
  return null;
}

/** A declared output: a path or glob inside the task's folder. */
const OutputPath = v.pipe(
  v.string("must be a path or glob"),
  v.rawCheck(({ dataset, addIssue }) => {
    const problem = dataset.typed ? outputPathProblem(dataset.value) : null;
    if (problem) addIssue({ message: problem });
  }),
);

/** A task name: what `--task`, `needs:` and the output's `[name]` prefix use. */
export const TASK_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;

/** One task of a job: the job's own fields (its defaults) and the tasks it waits for. */
const Task = v.strictObject({
  command: Command,
  workdir: v.optional(NonEmpty),
  env: v.optional(Env),
  environment: v.optional(Environment),
  resources: v.optional(Resources),
  needs: v.optional(v.array(NonEmpty, "must be a list of task names")),
  /** Files it leaves for the tasks that need it: paths or globs relative to its folder (jobs/outputs.ts). */
  outputs: v.optional(v.array(OutputPath, "must be a list of paths or globs relative to the task's folder")),
});

export const JobFileSchema = v.strictObject({
  name: v.optional(NonEmpty),
  command: v.optional(Command),
  workdir: v.optional(NonEmpty),
  env: v.optional(Env),
  environment: v.optional(Environment),
  resources: v.optional(Resources),
  tasks: v.optional(v.pipe(v.record(v.pipe(v.string(), v.regex(TASK_NAME, "is not a valid task name (letters, digits, . _ -)")), Task), v.check((t) => Object.keys(t).length > 0, "must name at least one task"))),
});

export type JobFile = v.InferOutput<typeof JobFileSchema>;
export type TaskFile = v.InferOutput<typeof Task>;
export type EnvironmentFile = v.InferOutput<typeof Environment>;

/** valibot's words for a type, as a job file's author says them. */
const TYPE_WORDS: Record<string, string> = { Object: "a mapping", Array: "a list", null: "nothing", undefined: "nothing" };

function describeIssue(issue: v.BaseIssue<unknown>): string {
  // A key that is empty or has spaces is shown quoted: `tasks."a b"`, `tasks.""`.
  // A list's item by its index: `tasks.prepare.outputs[0]`.
  const path = (issue.path ?? [])
    .map((p) => ({ key: String(p.key), index: p.type === "array" }))
    .map(({ key, index }, i) => (index ? `[${key}]` : `${i ? "." : ""}${i && !/^[A-Za-z0-9_-]+$/.test(key) ? JSON.stringify(key) : key}`))
    .join("");
  // A list where a mapping goes (`environment: [a]`): valibot reads its items as keys; the list is the problem.
  const last = issue.path?.at(-1);
  if (issue.expected === "never" && last && Array.isArray(last.input)) return `${path.slice(0, path.lastIndexOf("."))}: expected a mapping, got a list`;
  if (issue.expected === "never" && issue.path?.length) return `${path}: unknown key`;
  if (issue.received === "undefined" && issue.path?.length) return `${path}: is required`;
  const words = (t: string | null) => TYPE_WORDS[t ?? ""] ?? t;
  const message = /^Invalid (type|key)/.test(issue.message) ? `expected ${words(issue.expected)}, got ${words(issue.received)}` : issue.message;
  return path ? `${path}: ${message}` : message;
}

/** Validate parsed data; the first problem becomes one line naming the key path. */
export function validateJobFile(data: unknown, source: string): JobFile {
  if (data === null || typeof data !== "object" || Array.isArray(data)) throw new UsageError(`${source}: a job file must be a mapping of keys (name, command, environment, ...)`);
  const result = v.safeParse(JobFileSchema, data);
  if (!result.success) throw new UsageError(`${source}: ${describeIssue(result.issues[0])}`);
  return result.output;
}

/**
 * A job file is a few lines; one far larger is a mistake (or an attack: a 100 MB
 * YAML string once peaked at 4.25 GB of memory in the parser). Refused before
 * a byte of it is parsed.
 */
export const JOB_FILE_MAX_BYTES = 1024 * 1024;

const mib = (n: number) => `${(n / (1024 * 1024)).toFixed(n < 10 * 1024 * 1024 ? 1 : 0)} MiB`;

function tooBig(path: string, size: number, growing = false): UsageError {
  return new UsageError(`job file ${path} is ${growing ? "over " : ""}${mib(size)} (${size} bytes); the limit is ${mib(JOB_FILE_MAX_BYTES)} (${JOB_FILE_MAX_BYTES} bytes)`);
}

function notRegular(path: string, st: Stats): UsageError {
  const kind = st.isDirectory() ? "a directory" : st.isFIFO() ? "a FIFO" : st.isCharacterDevice() ? "a character device" : st.isBlockDevice() ? "a block device" : st.isSocket() ? "a socket" : "not a plain file";
  return new UsageError(`job file ${path} is ${kind}, not a regular file`);
}

/**
 * The file's text, read only if it is a regular file within the limit: stat
 * first (a FIFO or /dev/zero is refused before it is opened), then open without
 * blocking, check the open file again, and read at most the limit and one byte
 * (a file that grows meanwhile is refused too, never read whole).
 */
function readJobFileText(path: string): string {
  let st: Stats;
  try {
    st = statSync(path);
  } catch {
    throw new UsageError(`job file not found: ${path}`);
  }
  if (!st.isFile()) throw notRegular(path, st);
  if (st.size > JOB_FILE_MAX_BYTES) throw tooBig(path, st.size);
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (error) {
    throw new UsageError(`job file ${path}: cannot read it: ${(error as Error).message}`);
  }
  try {
    const opened = fstatSync(fd);
    if (!opened.isFile()) throw notRegular(path, opened);
    if (opened.size > JOB_FILE_MAX_BYTES) throw tooBig(path, opened.size);
    const buf = Buffer.alloc(JOB_FILE_MAX_BYTES + 1);
    let n = 0;
    while (n < buf.length) {
      const got = readSync(fd, buf, n, buf.length - n, n);
      if (got <= 0) break;
      n += got;
    }
    if (n > JOB_FILE_MAX_BYTES) throw tooBig(path, JOB_FILE_MAX_BYTES, true);
    return buf.toString("utf8", 0, n);
  } finally {
    closeSync(fd);
  }
}

export function loadJobFile(path: string): JobFile {
  const text = readJobFileText(path);
  let data: unknown;
  try {
    data = path.endsWith(".json") ? JSON.parse(text) : parseJobYaml(text);
  } catch (error) {
    // The parser's first line; one that ends in a colon announces a code frame (dropped): the colon goes too.
    throw new UsageError(`${basename(path)}: not valid ${path.endsWith(".json") ? "JSON" : "YAML"}: ${(error as Error).message.split("\n")[0]!.replace(/:\s*$/, "")}`);
  }
  return validateJobFile(data, basename(path));
}
