import { parseFlowQuery } from '../flows/index.js';
import { API_HELP, API_OPTIONS, apiFrom, apiGet } from './api-client.js';
import { type CliIO, configFrom, EXIT, parseOptions, UsageError } from './io.js';

export const OBSERVE_HELP = `Usage: moat observe [options]

Prints the flow records of a Moat node, oldest first, one aligned line each: time, sandbox,
kind, verdict, destination, the list and rule that decided, and for a close the bytes up and
down, the duration and how it ended.

Options:
  --sandbox ID         only this sandbox's flows
  --verdict V          allow or deny
  --kind K             dns, connect, http, transparent, direct or ingress
  --would-deny         only what report-mode sandboxes' rules would have denied (let through)
  --since T            an ISO 8601 time or a duration back from now (30s, 5m, 2h, 1d)
  --limit N            at most N stored records (1 to 10000, default 100)
  --follow             then print new records as they come, until interrupted
  --json               one JSON object per line instead of aligned text
${API_HELP}
  -h, --help           this help

Exit status: 0 done, 1 the API could not be reached or refused, 2 usage error.`;

interface View {
  time: string;
  event: string;
  sandboxID: string;
  kind: string;
  verdict: string;
  destination: { name: string | null; address: string | null; port: number | null };
  list: string;
  rule: string | null;
  wouldDeny?: { list: string; rule: string | null };
  bytesUp?: number;
  bytesDown?: number;
  durationMs?: number;
  end?: string;
}

const COLOURS = { allow: '\x1b[32m', deny: '\x1b[31m', reset: '\x1b[0m' } as const;

/** One aligned line for a record, coloured by verdict on a terminal. */
export function flowLine(view: View, colour: boolean): string {
  const { name, address, port } = view.destination;
  const where = [name, address === name ? null : address].filter(Boolean).join(' ') || '-';
  const destination = port === null ? where : `${where}:${port}`;
  const verdict = view.event === 'close' ? `${view.verdict}/close` : view.verdict;
  const painted =
    colour && (view.verdict === 'allow' || view.verdict === 'deny')
      ? `${COLOURS[view.verdict]}${verdict.padEnd(12)}${COLOURS.reset}`
      : verdict.padEnd(12);
  const decided = (list: string, rule: string | null) => (rule === null ? list : `${list} ${rule}`);
  const rule =
    view.wouldDeny === undefined
      ? decided(view.list, view.rule)
      : `report: would deny by ${decided(view.wouldDeny.list, view.wouldDeny.rule)}`;
  const closed =
    view.event === 'close'
      ? `  up ${view.bytesUp} B, down ${view.bytesDown} B, ${view.durationMs} ms, ${view.end}`
      : '';
  return `${view.time}  ${view.sandboxID.padEnd(24)}  ${view.kind.padEnd(11)}  ${painted}  ${destination.padEnd(40)}  ${rule}${closed}`;
}

export async function observe(args: string[], io: CliIO): Promise<number> {
  const { values, positionals } = parseOptions({
    args,
    options: {
      sandbox: { type: 'string' },
      verdict: { type: 'string' },
      kind: { type: 'string' },
      'would-deny': { type: 'boolean' },
      since: { type: 'string' },
      limit: { type: 'string' },
      follow: { type: 'boolean' },
      json: { type: 'boolean' },
      ...API_OPTIONS,
      help: { type: 'boolean', short: 'h' },
    },
    allowPositionals: true,
    strict: true,
  });
  if (values.help) {
    io.stdout.write(`${OBSERVE_HELP}\n`);
    return EXIT.ok;
  }
  if (positionals.length > 0) throw new UsageError(`unexpected argument ${positionals[0]}`);
  const params: Record<string, string> = {};
  const named = { sandboxID: values.sandbox, verdict: values.verdict, kind: values.kind };
  for (const [name, value] of Object.entries({
    ...named,
    since: values.since,
    limit: values.limit,
    wouldDeny: values['would-deny'] === true ? 'true' : undefined,
  }))
    if (value !== undefined) params[name] = value;
  // The API's own rules, checked here first: a usage error, not a refusal.
  const parsed = parseFlowQuery(params);
  if (!parsed.ok) throw new UsageError(parsed.error.replace(/^sandboxID/, '--sandbox'));
  const { api, key } = await apiFrom(values, () => configFrom({}, io).dataDir);
  const colour = !values.json && (io.stdout as { isTTY?: boolean }).isTTY === true;
  const print = (view: View) =>
    io.stdout.write(`${values.json ? JSON.stringify(view) : flowLine(view, colour)}\n`);
  const query = new URLSearchParams(params).toString();
  const fetched = await apiGet(`${api}/flows?${query}`, key, io, 'moat observe');
  if (fetched === undefined) return EXIT.failed;
  for (const view of ((await fetched.json()) as View[]).reverse()) print(view);
  if (!values.follow) return EXIT.ok;
  delete params.limit;
  const stream = await apiGet(
    `${api}/flows?${new URLSearchParams({ ...params, follow: 'true' })}`,
    key,
    io,
    'moat observe',
  );
  if (stream === undefined || stream.body === null) return EXIT.failed;
  let partial = '';
  try {
    for await (const chunk of stream.body as AsyncIterable<Uint8Array>) {
      const lines = (partial + Buffer.from(chunk).toString('utf8')).split('\n');
      partial = lines.pop()!;
      for (const line of lines) if (line !== '') print(JSON.parse(line) as View);
    }
  } catch (error) {
    // Moat stopped, or cut this follower for reading too slowly.
    io.stderr.write(`moat observe: the stream from ${api} broke: ${(error as Error).message}\n`);
    return EXIT.failed;
  }
  io.stderr.write(`moat observe: ${api} ended the stream\n`);
  return EXIT.failed;
}
