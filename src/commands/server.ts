import { defineCommand } from "citty";
import { rmSync } from "node:fs";
import { hostname } from "node:os";
import { commandContext, originText } from "./_context.ts";
import { forbidDumps } from "../core/no-dump.ts";
import { serverSettings, serverToken, startServer } from "../server/server.ts";
import { Output } from "../ui/output.ts";
import { outputArgs, refuseTokenOnCommandLine, rejectUnknownFlags } from "./_args.ts";
import type { ServerDoc } from "./_json.ts";
import { useNormalJitPolicy } from "../core/jit-policy.ts";

const args = {
  listen: { type: "string", valueHint: "HOST:PORT", description: "Where to listen (default 127.0.0.1:7070; 0.0.0.0:7070 for other machines)" },
  "token-file": { type: "string", valueHint: "FILE", description: "Read the server's own token, good for everything, from FILE (- : standard input; else GPULAYER_TOKEN_FILE, else GPULAYER_TOKEN, else the one generated on first start); named user and join tokens: gpulayer server token create" },
  token: { type: "string", valueHint: "TOKEN", description: "Refused: a token on the command line is readable by every process on the machine; use --token-file or GPULAYER_TOKEN" },
  database: { type: "string", valueHint: "postgres://USER:PASSWORD@HOST/DB", description: "Keep the state in PostgreSQL (default: SQLite in the server's home): any number of replicas on one database serve clients and workers alike" },
  files: { type: "string", valueHint: "DIR", description: "Where uploaded bundles and env artifacts go (default: the server's home); replicas need one folder they all reach" },
  ...outputArgs,
} as const;

export default defineCommand({
  meta: { name: "server", description: "Coordinate workers: an HTTP API that matches jobs to workers, streams their output, and warms environments everywhere" },
  args,
  subCommands: { token: () => import("./server-token.ts").then((m) => m.default) },
  async run({ args: a, rawArgs }) {
    if ((a._ as string[])[0] === "token") return; // citty ran the subcommand
    rejectUnknownFlags(rawArgs, args);
    refuseTokenOnCommandLine("server", a.token);
    // A job on this machine may not read the server's token from its environment or memory.
    forbidDumps();
    useNormalJitPolicy();
    const out = new Output(a);
    const ctx = await commandContext({ "coordinator.listen": a.listen, token_file: a["token-file"], "coordinator.database": a.database, "coordinator.files": a.files });
    const dir = ctx.layout.server;
    const settings = serverSettings(ctx.values);
    const token = serverToken(dir, ctx.values.token);
    // A token read from a file is named by what named the file (--token-file, GPULAYER_TOKEN_FILE, token_file in the config).
    const given = originText(ctx, ctx.settings.origins.token === ctx.settings.origins.token_file ? "token_file" : "token");
    const server = await startServer(dir, token.token, settings, (m) => out.log.info(m), token.file ? { text: token.file, kept: true } : { text: given, kept: false }).catch((error: unknown) => {
      // A token made by a start that then failed (the port in use, say) was never shown: the next start makes and shows one.
      if (token.generated && token.file) rmSync(token.file, { force: true });
      throw error;
    });
    if (token.overrides) out.log.warn(`the server's token comes from ${given}, not the one kept in ${token.overrides}: clients and workers holding that one are refused (leave out ${given} to use it)`);
    // Before the URL is printed: whoever starts a server waits for that line, and a SIGTERM that came before the
    // handler would end the process without stopping the server (exit 143).
    const stopped = new Promise<void>((resolve) => {
      const stop = (signal: string) => {
        out.progress(`${signal}: stopping the server`);
        void server.stop().then(resolve);
      };
      process.once("SIGINT", () => stop("SIGINT"));
      process.once("SIGTERM", () => stop("SIGTERM"));
    });
    // 0.0.0.0 is where it listens, not an address to give others: name this host instead.
    const where = new URL(server.url);
    if (where.hostname === "0.0.0.0" || where.hostname === "[::]") where.hostname = hostname();
    const reachable = where.origin;
    // A worker is given a join token (it registers, nothing else), never the server's own, which may do everything.
    const joinHint = [
      `workers: gpulayer server token create --role join --name NAME > join.token   (here: a token that registers workers and nothing else)`,
      `         gpulayer join ${reachable} --token-file join.token   (on each worker, the file copied there; --token-file - reads it from standard input)`,
    ];
    const doc: ServerDoc = { url: server.url, port: server.port, state: dir, token_file: token.file, replica: server.replica, database: server.database, files: settings.files ?? dir, ...(token.generated ? { token: token.token } : {}) };
    out.result(
      doc,
      () => [
        `gpulayer server listening on ${server.url} (state in ${settings.database ? server.database : dir})`,
        ...(settings.database ? [`replica ${server.replica} of the servers on ${server.database} (bundles and artifacts in ${settings.files ?? dir})`] : []),
        token.generated ? `the server's token, good for everything (shown once; kept in ${token.file}): ${token.token}` : `token: ${token.file ? `kept in ${token.file}` : "as given"}`,
        ...joinHint,
        `clients: export GPULAYER_SERVER=${reachable} GPULAYER_TOKEN=…`,
      ],
      true,
    );
    // Another replica cannot serve a bundle it cannot read: say so while it is cheap to fix.
    if (settings.database && !settings.files) out.log.warn(`bundles and env artifacts are kept in ${dir}, this machine's own folder: other replicas on ${server.database} cannot serve them; give every replica one shared folder with --files (GPULAYER_SERVER_FILES)`);
    out.progress(`worker lost after ${settings.lostSeconds} s without a heartbeat; jobs re-queued up to ${settings.maxAttempts} attempt(s)`);
    await stopped;
  },
});
