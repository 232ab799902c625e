/** A request refused with an HTTP status: thrown by the coordinator's rules, answered by routes.ts. */
export class HttpFail extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly extra: Record<string, unknown> = {},
  ) {
    super(message);
  }
}
