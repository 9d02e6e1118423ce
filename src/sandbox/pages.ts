/**
 * Cursor pagination shared by the sandbox and snapshot lists. A cursor names the last item
 * handed out by its sort key, not its position, so items created or removed between two page
 * requests neither repeat nor vanish from the pages still to come.
 */
export type Order = 'asc' | 'desc';

export interface Page<T> {
  readonly items: T[];
  /** Absent on the last page. */
  readonly nextToken: string | undefined;
}

type SortKey = readonly [time: number, id: string];

const compareKeys = (a: SortKey, b: SortKey) =>
  a[0] - b[0] || (a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0);

export class InvalidTokenError extends Error {
  override readonly name = 'InvalidTokenError';
}

function decodeToken(token: string): SortKey {
  try {
    const key: unknown = JSON.parse(Buffer.from(token, 'base64url').toString('utf8'));
    if (
      Array.isArray(key) &&
      key.length === 2 &&
      Number.isSafeInteger(key[0]) &&
      typeof key[1] === 'string'
    ) {
      return [key[0] as number, key[1] as string];
    }
  } catch {
    // fall through: any undecodable token is simply invalid
  }
  throw new InvalidTokenError('Invalid next token');
}

const encodeToken = (key: SortKey) => Buffer.from(JSON.stringify(key)).toString('base64url');

/** One page of `items` in `order` of `keyOf`, starting after the cursor `nextToken`. */
export function paginate<T>(
  items: readonly T[],
  keyOf: (item: T) => SortKey,
  options: { readonly order: Order; readonly limit: number; readonly nextToken?: string },
): Page<T> {
  const direction = options.order === 'asc' ? 1 : -1;
  const after = options.nextToken === undefined ? undefined : decodeToken(options.nextToken);
  const sorted = items
    .map((item) => ({ item, key: keyOf(item) }))
    .filter(({ key }) => after === undefined || compareKeys(key, after) * direction > 0)
    .sort((a, b) => compareKeys(a.key, b.key) * direction);
  const page = sorted.slice(0, options.limit);
  const last = page.at(-1);
  return {
    items: page.map(({ item }) => item),
    nextToken: sorted.length > options.limit && last ? encodeToken(last.key) : undefined,
  };
}
