import * as v from "valibot";
import { WireEnvironmentSchema } from "../env/request-schema.ts";

/** What the API accepts, checked before anything is stored: a malformed body is a 400 naming the field. */

const Str = v.pipe(v.string(), v.maxLength(64 * 1024));
const Name = v.pipe(v.string(), v.minLength(1), v.maxLength(200));
const StrList = v.pipe(v.array(Str), v.maxLength(1000));
const Labels = v.record(v.pipe(v.string(), v.regex(/^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$/)), v.pipe(v.string(), v.maxLength(200)));
/** Paths inside a bundle: relative, no `..`. */
const RelPath = v.pipe(
  v.string(),
  v.maxLength(4096),
  v.check((p) => !p.startsWith("/") && !p.split("/").includes(".."), "must be a path inside the bundle"),
);

/** A job's environment section, as it travels (env/request-schema.ts), its requirements path relative to the bundle. */
const Environment = v.strictObject({ ...WireEnvironmentSchema.entries, requirementsFile: v.optional(RelPath) });

const SpecEntries = {
  name: Name,
  argv: v.pipe(v.array(Str), v.minLength(1), v.maxLength(10_000)),
  commandText: Str,
  env: v.record(v.pipe(v.string(), v.regex(/^[A-Za-z_][A-Za-z0-9_]*$/)), Str),
  environment: Environment,
  resources: v.strictObject({
    gpus: v.pipe(v.number(), v.integer(), v.minValue(0), v.maxValue(1024)),
    frameworks: v.record(v.string(), v.string()),
  }),
};

const TaskName = v.pipe(v.string(), v.regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/));

/** A job, or a job of tasks: then it has no command of its own (argv empty) and each task is a job spec of its own. */
export const RemoteSpecSchema = v.union([
  v.strictObject(SpecEntries),
  v.strictObject({
    ...SpecEntries,
    argv: v.pipe(v.array(Str), v.maxLength(0)),
    tasks: v.pipe(
      v.array(v.strictObject({ name: TaskName, needs: v.array(TaskName), spec: v.strictObject(SpecEntries) })),
      v.minLength(1),
      v.maxLength(1000),
      v.check((ts) => ts.every((t) => t.needs.every((n) => n !== t.name && ts.some((o) => o.name === n))), "every need must name another task of the job"),
    ),
  }),
]);

const BundleHash = v.nullable(v.pipe(v.string(), v.regex(/^[0-9a-f]{64}$/)));

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
  name: v.pipe(v.string(), v.regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/, "must be letters, digits, . _ - (up to 63)")),
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
      envs: v.pipe(v.array(v.object({ key: v.pipe(v.string(), v.maxLength(64)), summary: v.pipe(v.string(), v.maxLength(200)), bytes: v.number(), last_used: v.nullable(v.string()), state: v.pipe(v.string(), v.maxLength(20)) })), v.maxLength(1000)),
    }),
  ),
});

/** `seq`: the outbox number of the first item (worker/outbox.ts); the rest follow it. */
const Seq = v.optional(v.pipe(v.number(), v.integer(), v.minValue(1)));

export const EventsSchema = v.object({
  events: v.pipe(
    v.array(v.object({ ts: v.number(), type: v.pipe(v.string(), v.maxLength(100)), data: v.record(v.string(), v.unknown()) })),
    v.maxLength(10_000),
  ),
  seq: Seq,
});

export const FinishSchema = v.object({
  seq: Seq,
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
      image: v.optional(v.string()),
      digest: v.optional(v.string()),
      message: v.optional(Str),
    }),
  ),
});

export const HandbackSchema = v.object({ reason: v.pipe(v.string(), v.maxLength(1000)), seq: Seq });
export const LeaveSchema = v.object({ final: v.boolean() });

/** Parse or explain: the first issue with its key path. */
export function parseBody<S extends v.GenericSchema>(schema: S, data: unknown): { ok: true; value: v.InferOutput<S> } | { ok: false; message: string } {
  const result = v.safeParse(schema, data);
  if (result.success) return { ok: true, value: result.output };
  const issue = result.issues[0];
  return { ok: false, message: `${v.getDotPath(issue) ?? "body"}: ${issue.message}` };
}
