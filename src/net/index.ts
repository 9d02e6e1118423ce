/**
 * Socket-level pieces several parts share: an address to bind or dial and how it is written,
 * what a failed bind means, bytes that arrive in pieces read as one run, and waiting for a
 * stream to drain.
 */
export { ArrivingBytes } from './arriving-bytes.js';
export { drainedOrClosed } from './drained.js';
export { formatHostPort, type HostPort } from './host-port.js';
export { listenFailure } from './listen-failure.js';
