/**
 * Request validation. Bodies are checked exactly as sent: no type coercion, no silently removed
 * fields, no defaults filled in (Fastify's default Ajv does all three). Query strings and path
 * parameters are text on the wire, so there numbers are coerced. Messages name the field and
 * the rule it broke: `body.timeout must be >= 0`, `body.network has unknown field "rules"`.
 */
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import type { FastifySchemaCompiler } from 'fastify';

const strict = new Ajv({ coerceTypes: false, removeAdditional: false, useDefaults: false });
const coercing = new Ajv({ coerceTypes: true, removeAdditional: false, useDefaults: false });
/** RFC 3339 date-time, as the SDK's `toISOString()` sends it. */
const RFC3339 =
  /^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$/;

/** A real moment: Date.parse alone takes February 31 for March 3. */
function dateTime(text: string): boolean {
  const match = RFC3339.exec(text);
  if (match === null || Number.isNaN(Date.parse(text))) return false;
  const [year, month, day] = match.slice(1, 4).map(Number) as [number, number, number];
  return day <= new Date(Date.UTC(year, month, 0)).getUTCDate();
}
for (const ajv of [strict, coercing]) {
  ajv.addFormat('date-time', dateTime);
}

export const validatorCompiler: FastifySchemaCompiler<object> = ({ schema, httpPart }) => {
  const validate: ValidateFunction = (httpPart === 'body' ? strict : coercing).compile(schema);
  // Returning Ajv's errors (not an Error) makes Fastify hand them to schemaErrorFormatter.
  return (data: unknown) =>
    validate(data) ? { value: data } : { error: validate.errors as unknown as Error };
};

export const schemaErrorFormatter = (errors: ErrorObject[], part: string): Error =>
  new Error(describeValidationError(errors, part));

/** `/network/allowOut/0` -> `.network.allowOut[0]` */
const fieldPath = (instancePath: string) =>
  instancePath
    .split('/')
    .slice(1)
    .map((part) => (/^[0-9]+$/.test(part) ? `[${part}]` : `.${part}`))
    .join('');

export function describeValidationError(errors: readonly ErrorObject[], part: string): string {
  const error = errors[0];
  if (error === undefined) return `${part} is invalid`;
  const field = `${part === 'querystring' ? 'query' : part}${fieldPath(error.instancePath)}`;
  switch (error.keyword) {
    case 'additionalProperties':
      return `${field} has unknown field ${JSON.stringify(error.params.additionalProperty)}`;
    case 'required':
      return `${field}.${String(error.params.missingProperty)} is required`;
    case 'format':
      return error.params.format === 'date-time'
        ? `${field} must be an RFC 3339 date-time such as 2026-01-31T12:00:00Z`
        : `${field} ${error.message ?? 'is invalid'}`;
    case 'enum':
      return `${field} must be one of ${(error.params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`;
    default:
      return `${field} ${error.message ?? 'is invalid'}`;
  }
}
