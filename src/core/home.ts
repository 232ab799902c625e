/**
 * The user's home folder: $HOME, else the password database's entry, as
 * os.homedir() reads it. node:os is loaded only in that second case: its
 * start-up costs every warm `env prepare`, where HOME is nearly always set.
 */
export function userHome(env: Record<string, string | undefined>): string {
  return env.HOME || (require("node:os") as typeof import("node:os")).homedir();
}
