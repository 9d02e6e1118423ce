import { formatHostPort, type HostPort } from './host-port.js';

/** What the usual bind failures mean, in words an operator acts on. */
const REASONS: Readonly<Record<string, string>> = {
  EADDRINUSE: 'address already in use (another program listens there; choose another port)',
  EACCES: 'permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)',
  EADDRNOTAVAIL: 'address not available (no interface of this host has it)',
};

/**
 * A listener that could not bind, named with its address, so that `cannot start:` says which
 * one: `DNS listener udp 127.0.0.1:3053: address already in use (...)`. The system's code is kept.
 */
export function listenFailure(listener: string, at: HostPort, error: unknown): Error {
  const code = (error as NodeJS.ErrnoException).code;
  const reason = (code && REASONS[code]) ?? (error as Error).message;
  return Object.assign(new Error(`${listener} ${formatHostPort(at)}: ${reason}`), { code });
}
