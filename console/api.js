/**
 * Talking to Moat's platform API from the page: the API key (this tab's sessionStorage only),
 * JSON reads, and the NDJSON stream of `GET /flows?follow=true`.
 */

const KEY_ITEM = 'moat-console-api-key';

/** A refusal of the API key: the page asks for another. */
export class KeyRefused extends Error {}

/**
 * The key given in the address's fragment (`#key=...`, for scripted use), kept for this tab and
 * removed from the address bar and history; undefined when the fragment gives none.
 */
export function keyFromFragment() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const given = fragment.get('key');
  if (given === null) return undefined;
  fragment.delete('key');
  const rest = fragment.toString();
  history.replaceState(null, '', `${location.pathname}${location.search}${rest ? `#${rest}` : ''}`);
  if (given === '') return undefined;
  keepKey(given);
  return given;
}

/** The key the address gives, else the one this tab kept, else undefined. */
export const takeKey = () => keyFromFragment() ?? sessionStorage.getItem(KEY_ITEM) ?? undefined;

export const keepKey = (key) => sessionStorage.setItem(KEY_ITEM, key);
export const forgetKey = () => sessionStorage.removeItem(KEY_ITEM);

/** The API's error message from a failed answer, else its status. */
async function failure(response, what) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && typeof body.message === 'string') message = body.message;
  } catch {}
  if (response.status === 401) return new KeyRefused(message);
  return new Error(`${what}: ${message}`);
}

export class Api {
  constructor(key) {
    this.key = key;
  }

  headers() {
    return { 'X-API-Key': this.key, Accept: 'application/json' };
  }

  async json(path, signal) {
    const response = await fetch(path, { headers: this.headers(), cache: 'no-store', signal });
    if (!response.ok) throw await failure(response, `GET ${path.split('?')[0]}`);
    return response.json();
  }

  /**
   * Calls `onRecord` with every record `GET /flows?follow=true&...` streams, until `signal`
   * aborts or the server ends the stream. `onOpen` runs once the stream's headers arrived.
   */
  async follow(query, signal, onOpen, onRecord) {
    const params = new URLSearchParams(query);
    params.set('follow', 'true');
    const response = await fetch(`/flows?${params}`, {
      headers: { 'X-API-Key': this.key, Accept: 'application/x-ndjson' },
      cache: 'no-store',
      signal,
    });
    if (!response.ok) throw await failure(response, 'GET /flows?follow=true');
    onOpen();
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let pending = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      pending += value;
      const lines = pending.split('\n');
      pending = lines.pop();
      for (const line of lines) {
        if (line.trim() === '') continue;
        try {
          onRecord(JSON.parse(line));
        } catch {}
      }
    }
  }
}
