import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, linkSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as tar from "tar";
import zlib from "node:zlib";
import { ClusterClient } from "../src/cluster/client.ts";
import { artifactFault } from "../src/env/store/artifact.ts";
import { FRAME, frameIndex } from "../src/env/store/frames.ts";
import { packEnv } from "../src/env/store/pack.ts";
import { unpackEnv } from "../src/env/store/unpack.ts";
import { homeLayout } from "../src/config/paths.ts";
import { InstallError } from "../src/errors.ts";
import { workerShipping } from "../src/worker/env-shipping.ts";
import { craftArtifact, escapes, metaEntry } from "./fixtures/crafted-tar.ts";
import { tempDir } from "./helpers.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

/**
 * A worker whose server cannot be asked when it needs an env (the server is
 * away: a real connection refused on 127.0.0.1): it builds, and says why; an
 * offline worker cannot build, and says that in one line.
 */

const KEY = "a".repeat(64);

async function closedPort(): Promise<number> {
  const s = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response("") });
  const port = s.port!;
  await s.stop(true);
  return port;
}

describe("env shipping with the server away", () => {
  test("a worker with an index builds here, the step saying why; an offline one fails with one line", async () => {
    const root = tempDir("gpl-ship-");
    const client = new ClusterClient(`http://127.0.0.1:${await closedPort()}`, "token-token-token-token");
    const layout = homeLayout(join(root, "home"), undefined);
    const conditions = { env_path: join(root, "home", "envs-v1", KEY), platform: "linux-x86_64", interpreter: "/usr/bin/python3", python: "3.11.2", base: "b".repeat(64) };
    const steps: string[] = [];
    const base = { layout, client, share: true, log: () => {}, uploads: new Set<Promise<void>>() };
    const online = workerShipping({ ...base, offline: false }, "task-1")!;
    const got = await online.acquire({ key: KEY, conditions, into: join(root, "into"), onStep: (step, detail) => steps.push(`${step} ${detail}`) });
    expect("build" in got).toBe(true);
    expect(steps).toEqual([expect.stringMatching(/^building here: the server could not be asked for an artifact \(cannot reach the gpulayer server at http:\/\/127\.0\.0\.1:\d+/)]);
    const offline = workerShipping({ ...base, offline: true }, "task-2")!;
    const error = await offline.acquire({ key: KEY, conditions, into: join(root, "into2") }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InstallError);
    expect((error as Error).message).toMatch(/^this worker is offline \(worker\.offline\) and builds no env, and the server could not be asked for an artifact of env aaaaaaaaaaaa: cannot reach the gpulayer server/);
    expect((error as Error).message).not.toContain("\n");
  });
});

describe("unpacking an artifact", () => {
  test("every crafted tar that would write outside the folder, or holds a hard link, is refused; nothing outside is written, and the server's check refuses it too", async () => {
    const root = tempDir("gpl-unpack-");
    const outside = join(root, "outside");
    mkdirSync(outside);
    writeFileSync(join(outside, "f"), "theirs");
    const key = KEY;
    const envPath = join(root, "envs-v1", KEY);
    let n = 0;
    for (const [name, entries] of Object.entries(escapes(outside, key, envPath))) {
      const file = join(root, `a${n}.tar.zst`);
      const sha = await craftArtifact(file, entries);
      const into = join(root, `into${n++}`);
      mkdirSync(into);
      const error = await unpackEnv(file, into).then(() => null, (e: Error) => e.message);
      expect({ name, error }).toEqual({ name, error: expect.stringMatching(/^the artifact holds an entry that may not be unpacked: /) });
      expect({ name, outside: readdirSync(outside), f: readFileSync(join(outside, "f"), "utf8"), links: statSync(join(outside, "f")).nlink }).toEqual({ name, outside: ["f"], f: "theirs", links: 1 });
      expect({ name, fault: await artifactFault(file, sha, key, envPath) }).toEqual({ name, fault: expect.stringMatching(/^it holds an entry that may not be unpacked: /) });
    }
  });

  test("an env with hard-linked files and an absolute symbolic link packs without a hard link entry and unpacks whole; the server's check names a wrong key", async () => {
    const root = tempDir("gpl-pack-");
    const env = join(root, "env");
    mkdirSync(join(env, ".gpulayer"), { recursive: true });
    mkdirSync(join(env, "bin"));
    mkdirSync(join(env, "lib"));
    writeFileSync(join(env, ".gpulayer", "meta.json"), JSON.stringify({ key: KEY, path: env }));
    writeFileSync(join(env, "lib", "a.py"), "A = 1\n");
    // uv links files from its cache, so two names of one file can be in one env.
    linkSync(join(env, "lib", "a.py"), join(env, "lib", "b.py"));
    symlinkSync("/usr/bin/python3", join(env, "bin", "python"));
    const file = join(root, "env.tar.zst");
    const packed = await packEnv(env, file);
    const types: string[] = [];
    await new Promise<void>((resolve, reject) => {
      const parser = new tar.Parser({ onReadEntry: (e) => (types.push(e.type), e.resume()) });
      parser.on("end", resolve).on("error", reject);
      parser.end(zlib.zstdDecompressSync(readFileSync(file)));
    });
    expect(types).not.toContain("Link");
    expect(types).toContain("SymbolicLink");
    const into = join(root, "into");
    mkdirSync(into);
    await unpackEnv(file, into);
    expect(readFileSync(join(into, "lib", "b.py"), "utf8")).toBe("A = 1\n");
    expect(lstatSync(join(into, "lib", "b.py")).isFile()).toBe(true);
    expect(readlinkSync(join(into, "bin", "python"))).toBe("/usr/bin/python3");
    expect(await artifactFault(file, packed.sha256, KEY, env)).toBeNull();
    expect(await artifactFault(file, packed.sha256, "b".repeat(64), env)).toBe(`it holds env aaaaaaaaaaaa at ${env}, not bbbbbbbbbbbb at ${env}`);
    expect(await artifactFault(file, "c".repeat(64), KEY, env)).toBe("its content does not match its sha256");
    const bare = join(root, "bare.tar.zst");
    const bareSha = await craftArtifact(bare, [{ name: "bin", type: "dir" }]);
    expect(await artifactFault(bare, bareSha, KEY, env)).toBe("it holds no .gpulayer/meta.json");
    const other = join(root, "other.tar.zst");
    expect(await artifactFault(other, await craftArtifact(other, [metaEntry("b".repeat(64), env)]), KEY, env)).toMatch(/^it holds env bbbbbbbbbbbb/);
  });

  // tar's own packer spun forever (or failed "write after end") under Bun on such an env; this bounds the test, not a speed.
  test("an env holding one file under many names (as the bytecode store links one module into many packages), files over several frames and a long path packs, and unpacks byte for byte", async () => {
    const root = tempDir("gpl-pack-");
    const env = join(root, "env");
    const deep = join(env, "lib", "python3.11", "site-packages", "a-package-with-a-long-name", "and_a_long_module_folder_name", "__pycache__");
    mkdirSync(join(env, ".gpulayer"), { recursive: true });
    mkdirSync(deep, { recursive: true });
    writeFileSync(join(env, ".gpulayer", "meta.json"), JSON.stringify({ key: KEY, path: env }));
    writeFileSync(join(env, ".gpulayer", "ready"), "");
    writeFileSync(join(env, "compiled.pyc"), "compiled empty module\n");
    writeFileSync(join(env, "empty.py"), "");
    for (let i = 0; i < 40; i++) {
      mkdirSync(join(env, `pkg${i}`, "__pycache__"), { recursive: true });
      linkSync(join(env, "compiled.pyc"), join(env, `pkg${i}`, "__pycache__", "__init__.cpython-311.pyc"));
      linkSync(join(env, "empty.py"), join(env, `pkg${i}`, "__init__.py"));
    }
    // Not compressible, and not a whole number of frames or tar blocks.
    const big = new Uint8Array(9 * 1024 ** 2 + 333);
    for (let at = 0; at < big.length; at += 65536) crypto.getRandomValues(big.subarray(at, at + 65536));
    writeFileSync(join(deep, `${"m".repeat(120)}.cpython-311.so`), big);
    writeFileSync(join(env, "small.txt"), "x".repeat(700));
    const file = join(root, "env.tar.zst");
    const packed = await packEnv(env, file);
    expect(packed.bytes).toBe(statSync(file).size);
    expect(await artifactFault(file, packed.sha256, KEY, env)).toBeNull();
    const into = join(root, "into");
    mkdirSync(into);
    await unpackEnv(file, into);
    const listing = (dir: string): string[] => readdirSync(dir, { recursive: true }).map(String).sort();
    // The builder's own ready marker stays behind: the fetcher writes its own once the env is checked.
    expect(listing(into)).toEqual(listing(env).filter((rel) => rel !== join(".gpulayer", "ready")));
    for (const rel of listing(into)) {
      const at = join(env, rel);
      if (!statSync(at).isFile()) continue;
      expect(Buffer.compare(readFileSync(join(into, rel)), readFileSync(at))).toBe(0);
      // Times kept: a module's bytecode is valid only against its source's mtime.
      expect(Math.floor(statSync(join(into, rel)).mtimeMs / 1000)).toBe(Math.floor(statSync(at).mtimeMs / 1000));
    }
    expect(lstatSync(join(into, "pkg7", "__pycache__", "__init__.cpython-311.pyc")).nlink).toBe(1);
    // Readers nobody here wrote read the same: zstd's and tar's own tools, where this machine has them.
    if (Bun.which("zstd") && Bun.which("tar")) {
      const listed = Bun.spawnSync(["sh", "-c", `zstd -dc "$0" | tar -t`, file]);
      expect(listed.stdout.toString().trim().split("\n").map((l) => l.replace(/\/$/, "")).sort()).toEqual(listing(into));
    }
  }, 30_000);

  test("an artifact whose frames lie about their sizes is refused before anything is decompressed past a frame, by the unpacker and the server's check alike", async () => {
    const root = tempDir("gpl-frames-");
    const zeros = Bun.zstdCompressSync(Buffer.alloc(64 << 20), { level: 3 });
    // The frame's own header says 4 MiB where it holds 64 (its content size field patched): a bomb that sizes itself small.
    const patched = Buffer.from(zeros);
    const d = patched[4]!;
    patched.writeUInt32LE(FRAME, 5 + ((d >> 5) & 1 ? 0 : 1) + [0, 1, 2, 4][d & 3]!);
    const quarter = Bun.zstdCompressSync(Buffer.alloc(FRAME), { level: 3 });
    const streamed = zlib.zstdCompressSync(Buffer.alloc(1000), { params: { [zlib.constants.ZSTD_c_contentSizeFlag]: 0 } });
    const cases: [string, Buffer, RegExp][] = [
      ["larger than a frame", Buffer.concat([frameIndex(zeros.length, 64 << 20), zeros]), /larger than any an artifact holds/],
      ["no size of its own", Buffer.concat([frameIndex(streamed.length, 1000), streamed]), /declares no size where its index says 1000/],
      ["its index and header disagree", Buffer.concat([frameIndex(zeros.length, 1 << 20), zeros]), /declares 67108864 size where its index says 1048576/],
      ["an index longer than its frame", Buffer.concat([frameIndex(quarter.length + 4, FRAME), quarter, Buffer.alloc(4)]), /are not one zstd frame/],
      ["a header that lies", Buffer.concat([frameIndex(patched.length, FRAME), patched]), /Decompression failed/],
      // Frames back to back decode one after another: 4 MiB declared, 12 MiB held (a bomb repeats it thousands of times).
      ["several frames as one", Buffer.concat([frameIndex(3 * quarter.length, FRAME), quarter, quarter, quarter]), /are not one zstd frame/],
      ["cut short", Buffer.concat([frameIndex(zeros.length + 10, 64 << 20).subarray(0, 8), frameIndex(zeros.length + 10, FRAME).subarray(8), zeros]), /ends inside a frame/],
    ];
    for (const [what, bytes, message] of cases) {
      const file = join(root, `${what}.tar.zst`);
      writeFileSync(file, bytes);
      const into = join(root, what);
      mkdirSync(into);
      const error = await unpackEnv(file, into).then(() => null, (e: Error) => e.message);
      expect(`${what}: ${error}`).toMatch(message);
      expect(readdirSync(into)).toEqual([]);
      expect(`${what}: ${await artifactFault(file, Bun.SHA256.hash(bytes, "hex"), KEY, into)}`).toMatch(message);
    }
  });
});
