import { afterAll, expect, test } from "bun:test";
import { cli, sandbox, startCli } from "./helpers.ts";
import { keepOutput, stopAll, type Kept } from "./fixtures/processes.ts";

/**
 * `gpulayer workers --wait N`: a script that starts a server and its workers
 * in the background waits for them with it, not with sleeps; a server still
 * starting is waited for too.
 */

const TOKEN = "workers-wait-token-0123456789";
const procs: Kept[] = [];
afterAll(() => stopAll(procs), 30_000);

/** A port nothing listens on now (taken, then let go). */
function freePort(): number {
  const s = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response() });
  const port = s.port!;
  s.stop(true);
  return port;
}

test("workers --wait 2 waits for the server to start and for both workers, then lists them; past --timeout it says what was there", async () => {
  const [server, w1, w2, client] = [sandbox(), sandbox(), sandbox(), sandbox()];
  const url = `http://127.0.0.1:${freePort()}`;
  const env = { ...client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN };
  const waiting = cli(["workers", "--wait", "2", "--timeout", "90"], { env });
  await Bun.sleep(500); // the client asks first: nothing answers yet
  keepOutput(startCli(["server", "--listen", url.slice(7)], { env: { ...server.env, GPULAYER_TOKEN: TOKEN } }), procs);
  for (const [name, box] of [["w1", w1], ["w2", w2]] as const) keepOutput(startCli(["join", url, "--name", name], { env: { ...box.env, GPULAYER_TOKEN: TOKEN, GPULAYER_WORKER_ENGINE: "none" } }), procs);
  const r = await waiting;
  expect(r.stderr).toBe("");
  expect(r.code).toBe(0);
  expect(r.stdout).toMatch(/^w1 .*\n^w2 /m);

  const more = await cli(["workers", "--wait", "3", "--timeout", "1"], { env });
  expect(more.code).toBe(1);
  expect(more.stderr.trim()).toBe("error: gave up waiting for 3 worker(s) after 1 s: 2 of 3 worker(s) connected");
}, 120_000);

test("workers --wait takes a count of at least 1, and --timeout only with it", async () => {
  const env = { ...sandbox().env, GPULAYER_SERVER: "http://127.0.0.1:9", GPULAYER_TOKEN: TOKEN };
  for (const [args, line] of [
    [["--wait", "0"], 'error: --wait takes a whole number of at least 1, not "0"'],
    [["--wait", "two"], 'error: --wait takes a whole number of at least 1, not "two"'],
    [["--timeout", "5"], "error: --timeout goes with --wait COUNT"],
  ] as const) {
    const r = await cli(["workers", ...args], { env });
    expect({ code: r.code, err: r.stderr.trim() }).toEqual({ code: 2, err: line });
  }
});
