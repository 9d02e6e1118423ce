/**
 * The schema pieces several route groups share. Each keeps its literal type (`as const`, `const`
 * type parameters): the handlers' request types are read from them.
 */
import type { JSONSchema } from 'json-schema-to-ts';

export const timeoutSeconds = {
  type: 'integer',
  minimum: 0,
  maximum: 2_147_483_647,
  description: 'Seconds',
} as const;

export const stringList = { type: 'array', items: { type: 'string' } } as const;

export const sandboxParams = {
  type: 'object',
  properties: { sandboxID: { type: 'string' } },
  required: ['sandboxID'],
} as const;

export const errorSchema = {
  type: 'object',
  description: 'Every platform error: code repeats the HTTP status',
  properties: { code: { type: 'integer' }, message: { type: 'string' } },
  required: ['code', 'message'],
} as const;

export const count = { type: 'integer', minimum: 0 };

/** A sandbox's flow totals: in GET /flows' terms, and in the sandbox detail reply. */
export const flowTotalsSchema = {
  type: 'object',
  description: 'Moat extension: this sandbox’s flows on its node since Moat started',
  properties: { allowed: count, denied: count, bytesUp: count, bytesDown: count },
  required: ['allowed', 'denied', 'bytesUp', 'bytesDown'],
};

export const noContent = { 204: { type: 'null', description: 'Done' } } as const;

/** The error body's schema for each status a route may answer with. */
export const errors = (...codes: number[]) =>
  Object.fromEntries(codes.map((code) => [code, errorSchema])) as Record<number, object>;

/** A body object: exactly these fields, `required` among them, nothing else. */
export const bodyObject = <
  const P extends Readonly<Record<string, JSONSchema>>,
  const R extends ReadonlyArray<keyof P & string>,
>(
  properties: P,
  required: R,
) => ({ type: 'object', properties, required, additionalProperties: false }) as const;
