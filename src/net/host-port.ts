/** An address a listener binds or a client dials, and how it is written in output and URLs. */
export interface HostPort {
  readonly host: string;
  readonly port: number;
}

/** `127.0.0.1:53`, `[::1]:53`: how addresses are written in output and URLs. */
export const formatHostPort = (a: HostPort): string =>
  a.host.includes(':') ? `[${a.host}]:${a.port}` : `${a.host}:${a.port}`;
