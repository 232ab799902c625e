import { Output } from "./output.ts";

/**
 * Text that came from a job (its name, command, labels, error messages) made
 * safe for one line of a terminal or a log: control characters are shown
 * escaped, so a name like "a\nerror: forged" cannot start a line of its own and
 * "\x1b[2J" cannot clear the screen. C0 and C1 controls, DEL, the Unicode line
 * and paragraph separators and the bidirectional overrides (which reorder what
 * is shown) are escaped; everything else, backslashes included, is left as it is.
 * For human output only: JSON output escapes by itself.
 */
const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

const NAMED: Record<string, string> = { "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f", "\v": "\\v" };

export function printable(text: string): string {
  return text.replace(UNSAFE, (c) => {
    const named = NAMED[c];
    if (named) return named;
    const code = c.charCodeAt(0);
    return code <= 0xff ? `\\x${code.toString(16).padStart(2, "0")}` : `\\u${code.toString(16).padStart(4, "0")}`;
  });
}

/** Each element is one line: whatever it holds is escaped, so it stays one line. */
export function printableLines(text: string | string[]): string[] {
  return (Array.isArray(text) ? text : [text]).map(printable);
}

/** An Output whose human result is printable line by line (see printable); its JSON result is unchanged. */
export class PrintableOutput extends Output {
  override result(data: unknown, human: () => string | string[], essential = false): void {
    super.result(data, () => printableLines(human()), essential);
  }
}
