import { describe, expect, setDefaultTimeout, test } from "bun:test";

// Real pip builds and real containers on a busy 2-core machine: seconds, not milliseconds.
setDefaultTimeout(120_000);
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pushBusybox, engineMatrix, engineTest, useRegistry, ENGINES } from "./fixtures/registry.ts";
import { cli, sandbox } from "./helpers.ts";

/** `job run` with an image, end to end, on each real engine and a real registry on 127.0.0.1. */
const matrix = await engineMatrix("job-image.test");
const { status, working } = matrix;

const registryOf = useRegistry(working);

describe.each(ENGINES)("job run --image with %s", (name) => {
  const it = engineTest(matrix, name);
  if (!it) return;

  it("pulls in task.prepare (miss), reuses on the next job (hit, no registry request), sees workdir and env, passes the exit code", async () => {
    const repo = `job-${name}`;
    const ref = await pushBusybox(registryOf(), repo, "1", working[0]!, [...new Set([working[0]!, name])]);
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    try {
      const wd = join(box.root, "wd");
      mkdirSync(wd);
      writeFileSync(join(wd, "input.txt"), "from-the-host\n");
      writeFileSync(join(wd, "job.yaml"), `name: boxed\ncommand: "cat input.txt; echo $GREETING; pwd; echo out > made-in-container.txt; exit 5"\nenv: {GREETING: hello-container}\nenvironment: {image: "${ref}"}\n`);
      const first = await cli(["job", "run", "-f", join(wd, "job.yaml")], { env: box.env });
      expect(first.code, first.stderr).toBe(5);
      // Named as the job names it (as a fleet's line does), not by a digest the user never gave.
      expect(first.stderr).toContain(`task.prepare pulled image ${ref} in `);
      expect(first.stdout).toContain("from-the-host");
      expect(first.stdout).toContain("hello-container");
      expect(first.stdout).toContain(wd);
      expect(readFileSync(join(wd, "made-in-container.txt"), "utf8")).toBe("out\n");
      const pulls = registryOf().manifestRequests(repo, "1");
      expect(pulls).toBeGreaterThan(0);
      // env list shows the recorded image beside the envs.
      const listed = JSON.parse((await cli(["env", "list", "--json"], { env: box.env })).stdout);
      expect(listed).toContainEqual(expect.objectContaining({ kind: "image", ref, engine: name, pulled_by_gpulayer: true }));

      const second = await cli(["job", "run", "--json", "-f", join(wd, "job.yaml")], { env: box.env });
      expect(second.code).toBe(5);
      expect(registryOf().manifestRequests(repo, "1")).toBe(pulls);
      const doc = JSON.parse(second.stdout);
      const prep = doc.phases.find((p: any) => p.name === "task.prepare");
      expect(prep.cache).toBe("hit");
      expect(doc.phases.find((p: any) => p.name === "task.run").exit_code).toBe(5);
      const list = JSON.parse((await cli(["job", "list", "--json"], { env: box.env })).stdout);
      const firstPrep = list[1].phases.find((p: any) => p.name === "task.prepare");
      expect(firstPrep.cache).toBe("miss");
    } finally {
      box.cleanup();
    }
  }, 120_000);

  it("a command the image cannot start: one gpulayer line, as for a host command, and the engine's code; a container's own stderr untouched", async () => {
    const ref = await pushBusybox(registryOf(), `job-start-${name}`, "1", working[0]!, [...new Set([working[0]!, name])]);
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    try {
      const missing = await cli(["job", "run", "--image", ref, "--", "no-such-cmd"], { env: box.env, cwd: box.root });
      expect({ code: missing.code, lines: missing.stderr.split("\n").filter((l) => /^(docker:|Run 'docker|Error:|gpulayer:)/.test(l)) }).toEqual({
        code: 127,
        lines: ["gpulayer: cannot start no-such-cmd: not found on the image's PATH"],
      });
      const notExecutable = await cli(["job", "run", "--image", ref, "--", "/etc/passwd"], { env: box.env, cwd: box.root });
      expect([126, 127]).toContain(notExecutable.code);
      expect(notExecutable.stderr).toMatch(/^gpulayer: cannot start \/etc\/passwd: (not executable|no such file) in the image$/m);
      // A command's own stderr that looks like an engine's, and its exit code, pass as they came.
      const own = await cli(["job", "run", "--image", ref, "--", "sh", "-c", "echo 'Error: runc: made up' >&2; exit 127"], { env: box.env, cwd: box.root });
      expect(own.code).toBe(127);
      expect(own.stderr).toContain("Error: runc: made up\n");
      expect(own.stderr).not.toContain("gpulayer: cannot start");
    } finally {
      box.cleanup();
    }
  }, 120_000);

  it("a missing image fails in task.prepare with the engine's message and never runs", async () => {
    const box = sandbox();
    box.env.GPULAYER_CONTAINER_ENGINE = name;
    try {
      const r = await cli(["job", "run", "--image", `${registryOf().host}/nope/missing:1`, "--", "sh", "-c", "echo ran"], { env: box.env, cwd: box.root });
      expect(r.code).not.toBe(0);
      expect(r.stdout).not.toContain("ran");
      expect(r.stderr.toLowerCase()).toMatch(/manifest unknown|not found/);
      const list = JSON.parse((await cli(["job", "list", "--json"], { env: box.env })).stdout);
      expect(list[0].state).toBe("failed");
      expect(list[0].phases.map((p: any) => p.name)).toEqual(["task.prepare"]);
    } finally {
      box.cleanup();
    }
  }, 120_000);
});
