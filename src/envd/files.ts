/** REST `/files` and `/files/compose` (being written). */
import { ConnectError } from './connect.js';
import type { CallContext } from './context.js';

export async function handleFiles(_context: CallContext, _url: URL): Promise<void> {
  throw new ConnectError('unimplemented', '/files is not implemented yet');
}

export async function handleCompose(_context: CallContext): Promise<void> {
  throw new ConnectError('unimplemented', '/files/compose is not implemented yet');
}
