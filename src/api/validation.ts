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
for (const ajv of [strict, coercing]) {
  ajv.addFormat('date-time', true);
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
    case 'enum':
      return `${field} must be one of ${(error.params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`;
    default:
      return `${field} ${error.message ?? 'is invalid'}`;
  }
}
