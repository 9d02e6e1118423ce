/**
 * The request head Moat sends an origin: a rule's fields replace the client's of the same name
 * whatever their case, exactly once; everything else end-to-end passes in order.
 */
import fc from 'fast-check';
import { describe, expect, test } from 'vitest';
import { originRequestText } from '../../src/proxy/exchange.js';
import { type HeaderField, parseRequestHead } from '../../src/proxy/http1.js';
import { canonicalName } from '../../src/policy/index.js';

const host = canonicalName('api.example.test');
if (!host.ok) throw new Error(host.error);
const target = { host: host.value, port: 443 };

const NAMES = ['Authorization', 'X-Api-Key', 'Accept', 'X-Trace', 'Cookie'];
const caseOf = (name: string, flips: boolean[]) =>
  [...name].map((c, i) => (flips[i % flips.length] ? c.toUpperCase() : c.toLowerCase())).join('');
const fieldName = fc
  .tuple(fc.constantFrom(...NAMES), fc.array(fc.boolean(), { minLength: 1, maxLength: 8 }))
  .map(([name, flips]) => caseOf(name, flips));
const fieldValue = fc.stringMatching(/^[!-~]([ -~]{0,20}[!-~])?$/);

function send(fields: HeaderField[], setFields: { name: string; value: string }[]) {
  const text = originRequestText(
    {
      head: { method: 'GET', target: '/', minor: 1, fields },
      target,
      path: '/',
      framing: { kind: 'none' },
      setFields,
    },
    true,
  );
  const parsed = parseRequestHead(Buffer.from(text, 'latin1'));
  if (!parsed.ok) throw new Error(parsed.message);
  return parsed.value.fields;
}

describe('fields a rule sets on a request', () => {
  test('replace every client field of the same name, in any case, exactly once', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fieldName, fieldValue), { maxLength: 12 }),
        fc.uniqueArray(fc.tuple(fieldName, fieldValue), {
          maxLength: 3,
          selector: ([name]) => name.toLowerCase(),
        }),
        (client, rule) => {
          const fields = client.map(([name, value]) => ({
            name,
            lower: name.toLowerCase(),
            value,
          }));
          const setFields = rule.map(([name, value]) => ({ name, value }));
          const sent = send(fields, setFields);
          const setNames = new Set(setFields.map((f) => f.name.toLowerCase()));
          for (const field of setFields)
            expect(sent.filter((f) => f.lower === field.name.toLowerCase())).toEqual([
              { name: field.name, lower: field.name.toLowerCase(), value: field.value },
            ]);
          // The client's other fields pass as they were, in order; Host is Moat's, once.
          expect(sent.filter((f) => !setNames.has(f.lower) && f.lower !== 'host')).toEqual(
            fields.filter((f) => !setNames.has(f.lower)),
          );
          expect(sent.filter((f) => f.lower === 'host').map((f) => f.value)).toEqual([
            'api.example.test',
          ]);
        },
      ),
      { numRuns: 300 },
    );
  });

  test.each([
    ['a client Host naming elsewhere', [{ name: 'Host', lower: 'host', value: 'evil.test' }], []],
    [
      'hop-by-hop fields the client sends',
      [
        { name: 'Connection', lower: 'connection', value: 'x-api-key' },
        { name: 'X-Api-Key', lower: 'x-api-key', value: 'client' },
      ],
      [{ name: 'X-Api-Key', value: 'rule' }],
    ],
  ])('%s cannot displace the rule or the Host', (_, fields, setFields) => {
    const sent = send(fields as HeaderField[], setFields);
    expect(sent.filter((f) => f.lower === 'host').map((f) => f.value)).toEqual([
      'api.example.test',
    ]);
    for (const field of setFields)
      expect(sent.filter((f) => f.lower === 'x-api-key').map((f) => f.value)).toEqual([
        field.value,
      ]);
    expect(sent.some((f) => f.lower === 'connection')).toBe(false);
  });
});
