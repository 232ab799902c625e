import { engineMessage } from "./engine.ts";

/**
 * `docker run` / `podman run` that could not start the command in its container (not found, not executable)
 * prints the engine's own error on stderr, where the container's output goes too: Docker's with a hint about
 * `docker run --help`. Held back while stderr may still be that error (its first line, before the container
 * printed anything), and said at the end in a gpulayer line, as a host job's command that cannot start is.
 * Anything else passes through untouched, byte for byte.
 */

/** The first line of an engine's failure to start a container, Docker's or Podman's (runc or crun under it). */
const ENGINE_LINE = /^(docker: Error response from daemon: |Error: (runc|crun|OCI runtime)\b|Error: .*OCI runtime)/;
/** What the engine's text says when the runtime could not start the command: what a command's own stderr would not. */
const RUNTIME_SAID = /unable to start container process|OCI runtime (create failed|attempted to invoke)/;
/** What such a line starts with: a first line still coming that could become one is held until it is whole. */
const ENGINE_STARTS = ["docker: Error response from daemon: ", "Error: "];

/** The engine's lines after its first: blank, or Docker's hint. Anything else is the command's own. */
const ENGINE_AFTER = /^(|Run '(docker|podman) run --help' for more information\.?)$/;
/** An engine that failed to start a container exits as it says so: what is still held this long after the first byte is the command's. */
const HELD_AT_MOST_MS = 500;

export class StartFailure {
  private held: Uint8Array[] = [];
  private text = "";
  private holding = true;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private readonly decoder = new TextDecoder();

  constructor(private readonly pass: (chunk: Uint8Array) => void) {}

  /** A stderr chunk of the engine's CLI. */
  stderr(chunk: Uint8Array): void {
    if (!this.holding) return this.pass(chunk);
    this.held.push(chunk);
    this.text += this.decoder.decode(chunk, { stream: true });
    this.timer ??= setTimeout(() => this.release(), HELD_AT_MOST_MS);
    const lines = this.text.split("\n");
    const whole = lines.slice(0, -1);
    const first = lines[0]!;
    const mayBe = whole.length ? ENGINE_LINE.test(first) && whole.slice(1).every((l) => ENGINE_AFTER.test(l)) : ENGINE_STARTS.some((s) => s.startsWith(first) || first.startsWith(s));
    if (!mayBe) this.release();
  }

  /** Anything on stdout: the container runs, and what stderr held is its own. */
  started(): void {
    if (this.holding) this.release();
  }

  /** At the exit: the line that says why it did not start (125 to 127, the engine's own codes), else what was held, as it came. */
  end(exitCode: number): string | null {
    if (!this.holding) return null;
    if (!this.held.length || exitCode < 125 || exitCode > 127 || !ENGINE_LINE.test(this.text) || !RUNTIME_SAID.test(this.text)) {
      this.release();
      return null;
    }
    clearTimeout(this.timer);
    this.holding = false;
    this.held = [];
    return startFailureLine(this.text);
  }

  private release(): void {
    clearTimeout(this.timer);
    if (!this.holding) return;
    this.holding = false;
    for (const chunk of this.held.splice(0)) this.pass(chunk);
  }
}

/** The engine's reason in a host job's words: `cannot start CMD: ...`. */
export function startFailureLine(text: string): string {
  const exec = /exec: "([^"]*)": (.*?)(?::\s*(?:unknown|OCI runtime\b.*))?$/m.exec(text);
  if (exec) {
    const [, command, why] = exec;
    if (/executable file not found in \$PATH/.test(why!)) return `cannot start ${command}: not found on the image's PATH`;
    if (/no such file or directory/.test(why!)) return `cannot start ${command}: no such file in the image`;
    if (/permission denied/.test(why!)) return `cannot start ${command}: not executable in the image`;
  }
  return `the container did not start: ${engineMessage(text)}`;
}
