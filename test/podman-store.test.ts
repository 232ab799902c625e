import { afterAll, describe, expect, setDefaultTimeout } from "bun:test";
import { chmodSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { homeLayout } from "../src/config/paths.ts";
import { listImageRecords } from "../src/docker/index.ts";
import { busyboxTar, engineMatrix, engineTest } from "./fixtures/registry.ts";
import { cli, run, sandbox } from "./helpers.ts";

setDefaultTimeout(120_000);

/**
 * A warm image job on Podman asks Podman nothing while Podman's image store
 * is unchanged (src/docker/podman-store.ts), and sees at once what changed
 * it: a tag moved to another image, the image removed. Real Podman, behind
 * a wrapper on PATH that logs each call and then runs it.
 */
const matrix = await engineMatrix("podman-store.test");

describe("podman", () => {
  const it = engineTest(matrix, "podman");
  if (!it) return;
  const ref = `localhost/gpl-store-${process.pid}/img:1`;
  const marked = (mark: string) => `localhost/gpl-store-${process.pid}/${mark}`; // :latest, as an alias names it
  afterAll(async () => {
    await run(["podman", "rmi", "-f", ref, marked("a"), marked("b")]);
  });

  it("a warm job asks Podman nothing while its store is unchanged; a moved tag and a removed image are seen on the next run", async () => {
    const box = sandbox();
    try {
      const real = Bun.which("podman")!;
      const log = join(box.root, "podman-calls");
      writeFileSync(join(box.root, "podman"), `#!/bin/sh\necho "$*" >> '${log}'\nexec '${real}' "$@"\n`);
      chmodSync(join(box.root, "podman"), 0o755);
      const env = { ...box.env, PATH: `${box.root}:${box.env.PATH}`, GPULAYER_CONTAINER_ENGINE: "podman" };
      const calls = () => readFileSync(log, "utf8").trim().split("\n");
      const tar = await busyboxTar();
      const first = (await run(["podman", "import", tar, ref])).stdout.trim().split("\n").at(-1)!;
      const job = (...command: string[]) => cli(["job", "run", "--json", "--image", ref, "--", ...command], { env, cwd: box.root });

      const warmUp = await job("true");
      expect(warmUp.code, warmUp.stderr).toBe(0);
      expect(listImageRecords(homeLayout(box.home))[0]).toMatchObject({ engine: "podman", ref, imageId: `sha256:${first.replace(/^sha256:/, "")}` });
      // Another process's pull or tag between two runs changes the store, and the next run rightly asks again:
      // one of three runs without a question shows the store's stamp at work (every run asks without it).
      const asked: string[][] = [];
      for (let i = 0; i < 3; i++) {
        writeFileSync(log, "");
        const warm = await job("true");
        expect(warm.code, warm.stderr).toBe(0);
        asked.push(calls().filter((c) => !c.startsWith("run ")));
        if (!asked.at(-1)!.length) break;
      }
      expect(asked.at(-1), `every warm run asked Podman: ${JSON.stringify(asked)}`).toEqual([]);
      // The container still came from the image id on record, not from the tag.
      expect(calls().find((c) => c.startsWith("run "))).toContain(`sha256:${first.replace(/^sha256:/, "")}`);

      // The tag moves to another image (the same files, another config): the next job runs that one.
      const moved = (await run(["podman", "import", "--change", "ENV GPL_STORE=moved", tar, ref])).stdout.trim().split("\n").at(-1)!;
      expect(moved).not.toBe(first);
      const after = await job("sh", "-c", "echo $GPL_STORE");
      expect(after.code, after.stderr).toBe(0);
      expect(after.stderr).toContain("moved");
      expect(listImageRecords(homeLayout(box.home))[0]!.imageId).toBe(`sha256:${moved.replace(/^sha256:/, "")}`);

      // Removed: refused in one line before anything runs, as without the stamp.
      await run(["podman", "rmi", "-f", ref]);
      const gone = await cli(["env", "prepare", "--image", ref, "--pull", "never"], { env, cwd: box.root });
      expect(gone.code).toBe(1);
      expect(gone.stderr.trim().split("\n").at(-1)).toBe(`error: image ${ref} is not on this machine (podman) and the pull policy is never`);
    } finally {
      rmSync(box.root, { recursive: true, force: true });
    }
  });

  it("a short name is asked about every run: Podman's registries configuration, not its store, says what it names", async () => {
    const box = sandbox();
    try {
      const tar = await busyboxTar();
      for (const mark of ["a", "b"]) expect((await run(["podman", "import", "--change", `ENV GPL_MARK=${mark}`, tar, marked(mark)])).code).toBe(0);
      const short = `gpl-short-${process.pid}`;
      const conf = join(box.root, "registries.conf");
      const alias = (mark: string) => writeFileSync(conf, `[aliases]\n"${short}" = "${marked(mark)}"\n`);
      const env = { ...box.env, GPULAYER_CONTAINER_ENGINE: "podman", CONTAINERS_REGISTRIES_CONF: conf };
      const mark = async () => {
        const r = await cli(["job", "run", "--image", short, "--", "sh", "-c", "echo mark=$GPL_MARK"], { env, cwd: box.root });
        expect(r.code, r.stderr).toBe(0);
        return r.stdout.trim();
      };
      alias("a");
      expect(await mark()).toBe("mark=a");
      expect(await mark()).toBe("mark=a");
      // The alias moves; Podman's store does not change.
      alias("b");
      expect(await mark()).toBe("mark=b");
      expect(listImageRecords(homeLayout(box.home))[0]!.storeStamp).toBeUndefined();
    } finally {
      rmSync(box.root, { recursive: true, force: true });
    }
  });
});
