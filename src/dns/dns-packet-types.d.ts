declare module 'dns-packet/types.js' {
  /** Record type number to its name (`UNKNOWN_<n>` for types dns-packet has no name for). */
  export function toString(type: number): string;
  /** Record type name to its number. */
  export function toType(name: string): number;
}
