import { defineCommand } from "citty";

export default defineCommand({
  meta: { name: "job", description: "Run jobs: prepare their environment (timed apart), run, record status and logs" },
  subCommands: {
    run: () => import("./run.ts").then((m) => m.default),
    status: () => import("./status.ts").then((m) => m.default),
    logs: () => import("./logs.ts").then((m) => m.default),
    list: () => import("./list.ts").then((m) => m.default),
    cancel: () => import("./cancel.ts").then((m) => m.default),
    outputs: () => import("./outputs.ts").then((m) => m.default),
    _exec: () => import("./exec.ts").then((m) => m.default),
  },
});
