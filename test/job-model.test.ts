import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { isJobEventName, JOB_EVENT_NAMES, jobEnd, PHASE_NAMES, readiness, unstartedEnds } from "../src/jobs/model.ts";

/** The one job model (src/jobs/model.ts): the `needs` rule both schedulers ask, and the event names every writer and reader uses. */

const states = (s: Record<string, string>) => (name: string) => s[name];

describe("the needs rule", () => {
  test("a task starts once every task it needs has succeeded, and waits for the others", () => {
    expect(readiness([], states({}), false)).toEqual({ ready: true });
    expect(readiness(["a", "b"], states({ a: "succeeded", b: "succeeded" }), false)).toEqual({ ready: true });
    expect(readiness(["a", "b"], states({ a: "succeeded", b: "running" }), false)).toEqual({ wait: ["b"] });
    expect(readiness(["a", "b"], states({ a: "queued" }), false)).toEqual({ wait: ["a", "b"] });
  });

  test("a need that ended otherwise skips it, naming the first such need; a cancelled job cancels it", () => {
    expect(readiness(["a", "b"], states({ a: "running", b: "failed" }), false)).toEqual({ end: "skipped", because: "not started: b, which it needs, failed" });
    for (const s of ["skipped", "cancelled"]) expect(readiness(["a"], states({ a: s }), false)).toEqual({ end: "skipped", because: `not started: a, which it needs, ${s}` });
    expect(readiness(["a"], states({ a: "succeeded" }), true)).toEqual({ end: "cancelled" });
  });

  test("a skip skips what needs it, however far round and wherever it sits in the file", () => {
    const tasks = [
      { name: "late", needs: ["mid"] },
      { name: "first", needs: [] },
      { name: "mid", needs: ["first"] },
      { name: "other", needs: [] },
    ];
    const now = { first: "failed", late: "waiting", mid: "waiting", other: "running" };
    const waiting = (n: string) => now[n as keyof typeof now] === "waiting";
    expect(unstartedEnds(tasks, states(now), waiting, false)).toEqual([
      { task: "mid", end: "skipped", because: "not started: first, which it needs, failed" },
      { task: "late", end: "skipped", because: "not started: mid, which it needs, skipped" },
    ]);
    // Cancelled: every task not started yet, and only those.
    expect(unstartedEnds(tasks, states(now), waiting, true).map((e) => [e.task, e.end])).toEqual([
      ["late", "cancelled"],
      ["mid", "cancelled"],
    ]);
  });

  test("the job ends with its tasks: failed with the first failed task's exit code, cancelled, or succeeded", () => {
    expect(jobEnd(["succeeded", "succeeded"], false, null)).toEqual({ state: "succeeded", exitCode: 0, error: null, event: { state: "succeeded", exit_code: 0 } });
    expect(jobEnd(["failed", "skipped"], false, { task: "train", exitCode: 3 })).toEqual({
      state: "failed",
      exitCode: 3,
      error: "task train failed (exit 3)",
      event: { state: "failed", exit_code: 3, failed_task: "train" },
    });
    expect(jobEnd(["succeeded", "cancelled"], true, null).state).toBe("cancelled");
    expect(jobEnd(["succeeded", "cancelled"], true, null).exitCode).toBe(jobEnd(["cancelled"], true, null).exitCode);
  });
});

describe("event names", () => {
  test("each is listed once", () => {
    expect(new Set(JOB_EVENT_NAMES).size).toBe(JOB_EVENT_NAMES.length);
  });

  test("every event name written in src/ is one of the model's (a phase's name aside)", () => {
    const src = resolve(import.meta.dir, "..", "src");
    const unknown: string[] = [];
    for (const file of new Bun.Glob("**/*.ts").scanSync(src)) {
      const code = readFileSync(join(src, file), "utf8");
      for (const m of code.matchAll(/["'`]((?:job|task)\.[a-z_]+(?:\.[a-z_]+)*)["'`]/g)) {
        const name = m[1]!;
        if (!isJobEventName(name) && !(PHASE_NAMES as readonly string[]).includes(name)) unknown.push(`src/${file}: ${name}`);
      }
    }
    expect(unknown).toEqual([]);
  });
});
