/**
 * The plugin's calls to Moat's platform API: the key read from the conflist's keyFile (refused
 * when others may read it), every call bounded in time, every failure a CNI error naming Moat's
 * address and what went wrong. The key itself is never part of a message.
 */
import { readFile, stat } from 'node:fs/promises';
import type { PluginConf } from './conf.js';
import { CNI_CODES, fail, type Outcome } from './spec.js';

/** A runtime waits for its plugin; Moat answers an attach in well under this. */
const CALL_TIMEOUT_MS = 15_000;

export interface MoatAnswer {
  readonly status: number;
  readonly body: unknown;
}

export class MoatApi {
  private constructor(
    private readonly api: string,
    private readonly key: string,
    private readonly keyFile: string,
  ) {}

  /** Reads the key; refuses a file that group or others may read or write. */
  static async open(conf: PluginConf): Promise<Outcome<MoatApi>> {
    const { keyFile } = conf;
    try {
      const mode = (await stat(keyFile)).mode & 0o777;
      if ((mode & 0o077) !== 0)
        return fail(
          CNI_CODES.badConfig,
          `keyFile ${keyFile} has mode ${mode.toString(8).padStart(4, '0')}: others than its owner may use the key; chmod 600 it`,
        );
      const key = (await readFile(keyFile, 'utf8')).trim();
      if (key === '') return fail(CNI_CODES.badConfig, `keyFile ${keyFile} is empty`);
      // What an HTTP header may carry: anything else would be refused by fetch in an error
      // that quotes the value, and the runtime logs what the plugin prints.
      if (!/^[\x21-\x7e]+$/.test(key))
        return fail(
          CNI_CODES.badConfig,
          `keyFile ${keyFile} holds more than one key: spaces, line breaks or other characters an API key has not`,
        );
      return { ok: true, value: new MoatApi(conf.api, key, keyFile) };
    } catch (error) {
      return fail(
        CNI_CODES.ioFailure,
        `cannot read keyFile ${keyFile}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`,
      );
    }
  }

  /** One call; a non-2xx answer other than `accept` is an error naming Moat's message. */
  async call(
    method: string,
    path: string,
    body?: unknown,
    accept: readonly number[] = [],
  ): Promise<Outcome<MoatAnswer>> {
    let response: Response;
    try {
      response = await fetch(`${this.api}${path}`, {
        method,
        headers: {
          'X-API-Key': this.key,
          ...(body === undefined ? {} : { 'Content-Type': 'application/json' }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
        // The key goes to the configured API only, never where an answer points.
        redirect: 'error',
        signal: AbortSignal.timeout(CALL_TIMEOUT_MS),
      });
    } catch (error) {
      const cause = (error as { cause?: Error }).cause?.message ?? (error as Error).message;
      return fail(CNI_CODES.tryAgainLater, `cannot reach Moat at ${this.api}: ${cause}`);
    }
    const text = await response.text().catch(() => '');
    let parsed: unknown;
    try {
      parsed = text === '' ? undefined : JSON.parse(text);
    } catch {
      parsed = text;
    }
    if (response.ok || accept.includes(response.status))
      return { ok: true, value: { status: response.status, body: parsed } };
    const message = (parsed as { message?: unknown } | undefined)?.message;
    const said = typeof message === 'string' ? message : response.statusText;
    if (response.status === 401)
      return fail(
        CNI_CODES.badKey,
        `Moat at ${this.api} refused the API key in ${this.keyFile} (401: ${said})`,
      );
    return fail(
      CNI_CODES.moatRefused,
      `Moat at ${this.api} refused ${method} ${path.split('?')[0]} (${response.status}: ${said})`,
    );
  }

  /** The IDs of the sandboxes Moat holds for a container (normally one, none after DEL). */
  async sandboxesOf(containerID: string): Promise<Outcome<string[]>> {
    // The metadata filter is key=value pairs URL-encoded, then encoded once more as a query value.
    const filter = encodeURIComponent(`cniContainerID=${encodeURIComponent(containerID)}`);
    const listed = await this.call('GET', `/sandboxes?metadata=${filter}`);
    if (!listed.ok) return listed;
    const items = Array.isArray(listed.value.body) ? (listed.value.body as unknown[]) : [];
    return {
      ok: true,
      value: items
        .map((item) => (item as { sandboxID?: unknown }).sandboxID)
        .filter((id): id is string => typeof id === 'string'),
    };
  }
}
