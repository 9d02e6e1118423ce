/** A page of a list as the API takes and answers it: the limit asked, the items, the cursor. */
import type { FastifyReply } from 'fastify';
import type { Page } from '../../sandbox/index.js';

/** The items as views; X-Next-Token carries the cursor of the next page (absent on the last). */
export function pageReply<T, V>(reply: FastifyReply, page: Page<T>, view: (item: T) => V): V[] {
  if (page.nextToken !== undefined) reply.header('X-Next-Token', page.nextToken);
  return page.items.map(view);
}

/** A list's `limit` query field: 1 to 100, clamped, 100 when left out. */
export const pageLimit = (limit: number | undefined) => Math.min(100, Math.max(1, limit ?? 100));
