import * as v from "valibot";
import { WireEnvironmentSchema } from "../env/index-light.ts";
import type { ReportsRequest } from "../cluster/protocol.ts";

/** What the API accepts, checked before anything is stored: a malformed body is a 400 naming the field. */

const Str = v.pipe(v.string(), v.maxLength(64 * 1024));
const Name = v.pipe(v.string(), v.minLength(1), v.maxLength(200));
const StrList = v.pipe(v.array(Str), v.maxLength(1000));
const Labels = v.record(v.pipe(v.string(), v.maxLength(63), v.regex(/^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$/)), v.pipe(v.string(), v.maxLength(200)));
/** Paths inside a bundle: relative, no `..`. */
const RelPath = v.pipe(
  v.string(),
  v.maxLength(4096),
  v.check((p) => !p.startsWith("/") && !p.split("/").includes(".."), "must be a path inside the bundle"),
);

/** A job's environment section, as it travels (env/request/request-schema.ts), its requirements path relative to the bundle. */
const Environment = v.strictObject({ ...WireEnvironmentSchema.entries, requirementsFile: v.optional(RelPath) });

const SpecEntries = {
  name: Name,
  argv: v.pipe(v.array(Str), v.minLength(1), v.maxLength(10_000)),
  commandText: Str,
  // A name's length is checked first: a refusal quotes what it refuses, which must not be megabytes.
  env: v.record(v.pipe(v.string(), v.maxLength(1024), v.regex(/^[A-Za-z_][A-Za-z0-9_]*$/)), Str),
  environment: Environment,
  resources: v.strictObject({
    gpus: v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(1024)),
    frameworks: v.record(v.string(), v.string()),
  }),
  /** A task's declared outputs: paths or globs inside its folder. */
  outputs: v.optional(v.pipe(v.array(v.pipe(RelPath, v.minLength(1))), v.maxLength(1000))),
};

/** Tasks in one job: each is a row, matched and dispatched on its own. */
export const MAX_TASKS = 1000;

const TaskName = v.pipe(v.string(), v.maxLength(63), v.regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/));

/** A job, or a job of tasks: then it has no command of its own (argv empty) and each task is a job spec of its own. */
export const RemoteSpecSchema = v.union([
  v.strictObject(SpecEntries),
  v.strictObject({
    ...SpecEntries,
    argv: v.pipe(v.array(Str), v.maxLength(0)),
    // Each task is checked by parseTasks, a few at a time; names and needs as a job file's are (jobs/task-graph.ts).
    tasks: v.pipe(v.array(v.unknown()), v.minLength(1), v.maxLength(MAX_TASKS, (issue) => `at most ${MAX_TASKS} tasks in a job (this one has ${issue.received})`)),
  }),
]);

const BundleHash = v.nullable(v.pipe(v.string(), v.maxLength(64), v.regex(/^[0-9a-f]{64}$/)));

export const SubmitSchema = v.strictObject({
  spec: RemoteSpecSchema,
  bundle: BundleHash,
  labels: Labels,
  workdir: Str,
});

export const PrepareSchema = v.strictObject({
  request: v.strictObject({ ...Environment.entries, pull: v.optional(v.picklist(["missing", "always", "never"])) }),
  bundle: BundleHash,
  labels: Labels,
});

const Gpu = v.object({
  index: v.number(),
  uuid: v.nullable(v.string()),
  name: v.nullable(v.string()),
  memoryMiB: v.nullable(v.number()),
  driver: v.nullable(v.string()),
});

export const RegisterSchema = v.strictObject({
  name: v.pipe(v.string(), v.maxLength(63, "must be letters, digits, . _ - (up to 63)"), v.regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/, "must be letters, digits, . _ - (up to 63)")),
  labels: Labels,
  slots: v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(1024)),
  probe: v.object({
    hostname: v.string(),
    os: v.string(),
    arch: v.string(),
    cpus: v.number(),
    memoryBytes: v.number(),
    gpus: v.pipe(v.array(Gpu), v.maxLength(1024)),
    python: v.nullable(v.object({ path: v.string(), version: v.string() })),
    pythonError: v.optional(v.string()),
    frameworks: v.record(v.string(), v.string()),
    cuda: v.nullable(v.string()),
    engine: v.nullable(v.picklist(["docker", "podman"])),
    probeMs: v.number(),
    offline: v.optional(v.boolean()),
    shareEnvs: v.optional(v.boolean()),
    conda: v.optional(v.pipe(v.array(v.object({ name: v.nullable(v.string()), prefix: v.string(), frameworks: v.record(v.string(), v.string()) })), v.maxLength(1000))),
  }),
  /** The id and credential it was given before (kept in its home): the same worker, back. */
  resume: v.optional(v.strictObject({ id: v.pipe(v.string(), v.maxLength(100)), credential: v.pipe(v.string(), v.maxLength(200)) })),
});

export const HeartbeatSchema = v.object({
  running: v.pipe(v.array(v.string()), v.maxLength(10_000)),
  free_gpus: v.optional(v.array(v.number())),
  /** Its env cache, sent when it changed (a worker reports at most 1,000 envs). */
  cache: v.optional(
    v.object({
      bytes: v.number(),
      entries: v.number(),
      prefetch: v.optional(
        v.object({
          state: v.picklist(["prefetching", "done", "off", "failed"]),
          wanted: v.number(),
          planned: v.number(),
          fetched: v.number(),
          present: v.number(),
          bytes: v.number(),
          keys: v.pipe(v.array(v.pipe(v.string(), v.maxLength(64))), v.maxLength(1000)),
          reason: v.optional(v.pipe(v.string(), v.maxLength(2000))),
        }),
      ),
      envs: v.pipe(
        v.array(
          v.object({
            key: v.pipe(v.string(), v.maxLength(64)),
            summary: v.pipe(v.string(), v.maxLength(200)),
            bytes: v.number(),
            last_used: v.nullable(v.string()),
            state: v.pipe(v.string(), v.maxLength(20)),
            python: v.optional(v.nullable(v.object({ version: v.pipe(v.string(), v.maxLength(40)), path: v.pipe(v.string(), v.maxLength(4096)) }))),
            requirements_file: v.optional(v.nullable(v.object({ path: v.pipe(v.string(), v.maxLength(4096)), digest: v.pipe(v.string(), v.maxLength(64)) }))),
          }),
        ),
        v.maxLength(1000),
      ),
    }),
  ),
});

/** `seq`: the outbox number of the first item (worker/outbox.ts); the rest follow it. */
const Seq = v.optional(v.pipe(v.number(), v.integer(), v.minValue(1)));

const EventIn = v.object({ ts: v.number(), type: v.pipe(v.string(), v.maxLength(100)), data: v.record(v.string(), v.unknown()) });

export const EventsSchema = v.object({
  events: v.pipe(v.array(EventIn), v.maxLength(10_000)),
  seq: Seq,
});

const FinishBody = v.object({
  state: v.picklist(["succeeded", "failed", "cancelled"]),
  exit_code: v.nullable(v.number()),
  error: v.nullable(Str),
  result: v.optional(
    v.object({
      status: v.picklist(["built", "reused", "fetched", "pulled", "failed"]),
      seconds: v.number(),
      fetched: v.optional(v.object({ bytes: v.number(), seconds: v.number(), built_by: v.pipe(v.string(), v.maxLength(200)) })),
      key: v.optional(v.string()),
      path: v.optional(v.string()),
      installer_path: v.optional(v.nullable(Name)),
      check: v.optional(StrList),
      shadowed: v.optional(v.pipe(v.array(v.object({ name: Name, worker: Name, locked: Name })), v.maxLength(1000))),
      image: v.optional(v.string()),
      digest: v.optional(v.string()),
      message: v.optional(Str),
    }),
  ),
});

export const FinishSchema = v.object({ ...FinishBody.entries, seq: Seq });

/** Output in a report of several kinds: base64 (a report is JSON), 1 MiB of output at most. */
const OutputIn = v.pipe(v.string(), v.maxLength(Math.ceil((1024 * 1024) / 3) * 4), v.base64());

/** Outbox items of several kinds in order (`POST /v1/tasks/ID/reports`): events, output, and an end only as the last. */
const ReportItemIn = v.pipe(
  v.strictObject({ event: v.optional(EventIn), output: v.optional(OutputIn), stream: v.optional(v.picklist(["stdout", "stderr"])), finish: v.optional(FinishBody) }),
  v.check((i) => [i.event, i.output, i.finish].filter((x) => x !== undefined).length === 1, "an item is one of event, output (with stream) or finish"),
  v.check((i) => (i.output === undefined) === (i.stream === undefined), "output goes with its stream, and only output"),
);
export const ReportsSchema = v.pipe(
  v.object({ seq: Seq, items: v.pipe(v.array(ReportItemIn), v.maxLength(10_000)) }),
  v.check((r) => r.items.every((item, i) => item.finish === undefined || i === r.items.length - 1), "items: a finish only as the last item"),
);
// What a worker sends (cluster/protocol.ts) is what this takes: a field added to one side only fails to compile.
true satisfies ReportsRequest extends v.InferInput<typeof ReportsSchema> ? true : never;

export const HandbackSchema = v.object({ reason: v.pipe(v.string(), v.maxLength(1000)), seq: Seq });
export const LeaveSchema = v.object({ final: v.boolean() });

const TaskSchema = v.strictObject({ name: TaskName, needs: v.pipe(v.array(TaskName), v.maxLength(MAX_TASKS)), spec: v.strictObject(SpecEntries) });
/** Tasks checked between two turns of the event loop: a job of 1,000 holds nobody else's request up for long. */
const TASKS_AT_ONCE = 50;

/** A job's tasks, checked a few at a time with the event loop turning in between; an issue's path is the task's place in the job. */
export async function parseTasks(tasks: unknown[]): Promise<{ ok: true; value: v.InferOutput<typeof TaskSchema>[] } | { ok: false; message: string }> {
  const value: v.InferOutput<typeof TaskSchema>[] = [];
  for (let i = 0; i < tasks.length; i++) {
    if (i && i % TASKS_AT_ONCE === 0) await new Promise((resolve) => setImmediate(resolve));
    const parsed = parseBody(TaskSchema, tasks[i]);
    if (!parsed.ok) return { ok: false, message: `spec.tasks.${i}${parsed.message.startsWith("body:") ? parsed.message.slice(4) : `.${parsed.message}`}` };
    value.push(parsed.value);
  }
  return { ok: true, value };
}

/** Parse or explain: the first issue with its key path. */
export function parseBody<S extends v.GenericSchema>(schema: S, data: unknown): { ok: true; value: v.InferOutput<S> } | { ok: false; message: string } {
  const result = v.safeParse(schema, data);
  if (result.success) return { ok: true, value: result.output };
  const issue = result.issues[0];
  return { ok: false, message: `${v.getDotPath(issue) ?? "body"}: ${issue.message}` };
}
