/** Where `moat check --replay` reads recorded decisions: a flow log file, or a node's API. */
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import { apiFrom, apiGet } from './api-client.js';
import { type CliIO, UsageError } from './io.js';
import { type RecordedDecision, readRecord } from './replay.js';

/** The most GET /flows returns in one answer. */
const API_LIMIT = 10_000;

export interface ReplaySource {
  replay?: string;
  'replay-api'?: string;
  sandbox?: string;
  key?: string;
  'key-file'?: string;
}

/**
 * The recorded decisions (of --sandbox, when given), or undefined after saying why they could
 * not be read. Lines that are not flow records are counted and the first one named.
 */
export async function replayRecords(
  source: ReplaySource,
  io: CliIO,
  dataDir: () => string,
): Promise<RecordedDecision[] | undefined> {
  if (source.replay !== undefined && source['replay-api'] !== undefined)
    throw new UsageError('give --replay FILE or --replay-api URL, not both');
  const wanted = (record: RecordedDecision) =>
    source.sandbox === undefined || record.sandboxID === source.sandbox;
  if (source['replay-api'] !== undefined) {
    const { api, key } = await apiFrom({ ...source, api: source['replay-api'] }, dataDir);
    const query = new URLSearchParams({ limit: String(API_LIMIT) });
    if (source.sandbox !== undefined) query.set('sandboxID', source.sandbox);
    const answer = await apiGet(`${api}/flows?${query}`, key, io, 'moat check');
    if (answer === undefined) return undefined;
    const views = (await answer.json()) as unknown[];
    return views
      .map((view) => readRecord(view))
      .filter((r): r is RecordedDecision => typeof r === 'object' && wanted(r));
  }
  const file = source.replay!;
  const records: RecordedDecision[] = [];
  let skipped = 0;
  let first: string | undefined;
  let number = 0;
  try {
    const lines = createInterface({
      input: createReadStream(file),
      crlfDelay: Number.POSITIVE_INFINITY,
    });
    for await (const line of lines) {
      number++;
      if (line.trim() === '') continue;
      let read: ReturnType<typeof readRecord>;
      try {
        read = readRecord(JSON.parse(line));
      } catch {
        read = 'not JSON';
      }
      if (typeof read === 'string') {
        skipped++;
        first ??= `line ${number}: ${read}`;
      } else if (read !== undefined && wanted(read)) records.push(read);
    }
  } catch (error) {
    throw new UsageError(`--replay ${file}: ${(error as Error).message}`);
  }
  if (skipped > 0)
    io.stderr.write(`moat check: --replay ${file}: skipped ${skipped} line(s); first: ${first}\n`);
  return records;
}
