import { defineCommand } from "citty";
import { join } from "node:path";
import { ServerStore } from "../server/store.ts";
import { DATABASE_MARKER, openDatabase } from "../server/server.ts";
import { existsSync, readFileSync } from "node:fs";
import { TOKEN_ROLES, type TokenRole } from "../server/tokens.ts";
import { Output, table } from "../ui/output.ts";
import { UsageError, UserError } from "../errors.ts";
import { outputArgs, rejectUnknownFlags } from "./_args.ts";
import { commandContext } from "./_context.ts";
import type { ServerTokenCreateDoc, ServerTokenListDoc, ServerTokenRevokeDoc } from "./_json.ts";

/** The server's token table, in its database (running server or not: it reads the table on every request). */
async function tokens(database: string | undefined) {
  const ctx = await commandContext({ "coordinator.database": database });
  const dir = ctx.layout.server;
  // This home's server keeps its tokens in PostgreSQL: a token made in the SQLite file beside it would be good nowhere.
  const marker = join(dir, DATABASE_MARKER);
  if (!ctx.values["coordinator.database"] && existsSync(marker)) throw new UsageError(`the server of this home keeps its state in ${readFileSync(marker, "utf8").trim()}: give that database with --database (or GPULAYER_DATABASE)`);
  const db = await openDatabase(dir, ctx.values["coordinator.database"] ?? null);
  const store = new ServerStore(db, ctx.values["coordinator.files"] ?? dir);
  return { db, tokens: store.tokens };
}

const databaseArg = { database: { type: "string", valueHint: "postgres://…", description: "The servers' PostgreSQL (GPULAYER_DATABASE), when they keep their state there" } } as const;

const createArgs = {
  role: { type: "string", required: true, valueHint: TOKEN_ROLES.join("|"), description: "user: submit, read, cancel and prepare; join: register a worker, nothing else" },
  name: { type: "string", required: true, description: "What the token is for (a person, a machine); how list and revoke name it" },
  ...databaseArg,
  json: outputArgs.json,
} as const;

const create = defineCommand({
  meta: { name: "create", description: "Make a named token for this server and print it, once (only its hash is kept)" },
  args: createArgs,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, createArgs);
    if (!TOKEN_ROLES.includes(a.role as TokenRole)) throw new UsageError(`--role ${a.role}: one of ${TOKEN_ROLES.join(", ")}`);
    const { db, tokens: t } = await tokens(a.database);
    const token = await t.create(a.name, a.role as TokenRole).finally(() => db.close());
    const doc: ServerTokenCreateDoc = { name: a.name, role: a.role as TokenRole, token };
    const use = a.role === "join" ? "on the worker: gpulayer join URL --token-file FILE (or GPULAYER_TOKEN, or --token-file - from standard input)" : "for clients: GPULAYER_TOKEN, or --token-file FILE";
    const out = new Output(a);
    // The token alone on stdout (`> join.token` makes a token file); the note on stderr.
    out.progress(`${a.role} token ${a.name}, shown once; ${use}`);
    out.result(doc, () => token);
  },
});

const listArgs = { ...databaseArg, json: outputArgs.json } as const;
const list = defineCommand({
  meta: { name: "list", description: "The server's named tokens: name, role, when made and last used (never the tokens)" },
  args: listArgs,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, listArgs);
    const { db, tokens: t } = await tokens(a.database);
    const rows = await t.list().finally(() => db.close());
    const iso = (ms: number | null) => (ms === null ? null : new Date(ms).toISOString());
    const doc: ServerTokenListDoc = rows.map((r) => ({ name: r.name, role: r.role, created: iso(r.created)!, last_used: iso(r.lastUsed) }));
    new Output(a).result(doc, () => (rows.length ? table([["NAME", "ROLE", "CREATED", "LAST USED"], ...doc.map((r) => [r.name, r.role, r.created, r.last_used ?? "never"])]) : ["no named tokens (the server's own token is in its home: server/token)"]));
  },
});

const revokeArgs = { name: { type: "positional", required: true, valueHint: "NAME", description: "The token to revoke" }, ...databaseArg, json: outputArgs.json } as const;
const revoke = defineCommand({
  meta: { name: "revoke", description: "Revoke a named token at once; workers that joined with a revoked join token are dropped" },
  args: revokeArgs,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, revokeArgs);
    const { db, tokens: t } = await tokens(a.database);
    const revoked = await t.revoke(a.name).finally(() => db.close());
    if (!revoked) throw new UserError(`no token named ${a.name} (see gpulayer server token list)`);
    const doc: ServerTokenRevokeDoc = { name: a.name, revoked: true };
    new Output(a).result(doc, () => `revoked ${a.name}`);
  },
});

export default defineCommand({
  meta: { name: "token", description: "The server's named tokens (user and join), kept in its home: create, list, revoke" },
  subCommands: { create, list, revoke },
});
