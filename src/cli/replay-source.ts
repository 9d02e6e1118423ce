/**
 * Where `moat check --replay` and `moat suggest` read recorded decisions, and the internal deny list they are
 * decided under: a flow log file (and the check's own list), or a node's API (and the node's).
 */
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import type { MoatConfig } from '../config.js';
import { DEFAULT_INTERNAL_DENY, type InternalRange, internalRange } from '../policy/index.js';
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
  /** Given as a flag: a what-if of the list itself, which a node's list does not replace. */
  'internal-deny'?: string[];
}

export interface ReplayInput {
  readonly records: RecordedDecision[];
  readonly internalDeny: readonly InternalRange[];
}

const isDefaultList = (ranges: readonly InternalRange[]) =>
  ranges.length === DEFAULT_INTERNAL_DENY.length &&
  ranges.every((range, i) => range.entry === DEFAULT_INTERNAL_DENY[i]!.entry);

/** How the command reading records names itself and its two sources in messages. */
export interface ReplayCommand {
  readonly command: string;
  readonly fileFlag: string;
  readonly apiFlag: string;
}

const CHECK_COMMAND: ReplayCommand = {
  command: 'moat check',
  fileFlag: '--replay',
  apiFlag: '--replay-api',
};

/**
 * The recorded decisions (of --sandbox, when given) and the internal deny list to decide them
 * under, or undefined after saying why they could not be read. Lines of a file that are not
 * flow records are counted and the first one named.
 */
export async function replayInput(
  source: ReplaySource,
  io: CliIO,
  config: MoatConfig,
  names: ReplayCommand = CHECK_COMMAND,
): Promise<ReplayInput | undefined> {
  const { command, fileFlag, apiFlag } = names;
  if (source.replay !== undefined && source['replay-api'] !== undefined)
    throw new UsageError(`give ${fileFlag} FILE or ${apiFlag} URL, not both`);
  const wanted = (record: RecordedDecision) =>
    source.sandbox === undefined || record.sandboxID === source.sandbox;
  if (source['replay-api'] !== undefined) {
    const { api, key } = await apiFrom(
      { ...source, api: source['replay-api'] },
      () => config.dataDir,
    );
    const internalDeny =
      source['internal-deny'] === undefined
        ? await nodeInternalDeny(api, key, io, command)
        : config.internalDeny;
    if (internalDeny === undefined) return undefined;
    const query = new URLSearchParams({ limit: String(API_LIMIT) });
    if (source.sandbox !== undefined) query.set('sandboxID', source.sandbox);
    const answer = await apiGet(`${api}/flows?${query}`, key, io, command);
    if (answer === undefined) return undefined;
    const views = (await answer.json()) as unknown[];
    const records = views
      .map((view) => readRecord(view))
      .filter((r): r is RecordedDecision => typeof r === 'object' && wanted(r));
    return { records, internalDeny };
  }
  const records = await fileRecords(source.replay!, wanted, io, names);
  // A file does not say which list its node enforced: a default one is named as such.
  if (isDefaultList(config.internalDeny))
    io.stderr.write(
      `${command}: the internal deny list is Moat's default; if the node that wrote the records runs another, give it here (--internal-deny, as the node's --print-config shows it), or read the records with ${apiFlag} URL, which reads the node's\n`,
    );
  return { records, internalDeny: config.internalDeny };
}

/** The node's internal deny list (GET /internal-deny), or undefined after saying why not. */
async function nodeInternalDeny(
  api: string,
  key: string,
  io: CliIO,
  command: string,
): Promise<InternalRange[] | undefined> {
  const answer = await apiGet(`${api}/internal-deny`, key, io, command);
  if (answer === undefined) return undefined;
  const { internalDeny } = (await answer.json()) as {
    internalDeny: Array<{ entry: string; description: string }>;
  };
  const ranges: InternalRange[] = [];
  for (const { entry, description } of internalDeny) {
    const range = internalRange(entry, description);
    if (!range.ok) {
      io.stderr.write(
        `${command}: ${api}/internal-deny: ${JSON.stringify(entry)}: ${range.error}\n`,
      );
      return undefined;
    }
    ranges.push(range.value);
  }
  return ranges;
}

/** The decisions a flow log file records; its other lines are counted, the first one named. */
async function fileRecords(
  file: string,
  wanted: (record: RecordedDecision) => boolean,
  io: CliIO,
  { command, fileFlag }: ReplayCommand,
): Promise<RecordedDecision[]> {
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
    throw new UsageError(`${fileFlag} ${file}: ${(error as Error).message}`);
  }
  if (skipped > 0)
    io.stderr.write(
      `${command}: ${fileFlag} ${file}: skipped ${skipped} line(s); first: ${first}\n`,
    );
  return records;
}
