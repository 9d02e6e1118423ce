/**
 * The documentation stays true to the repository, and the layout it describes stays true to the
 * code: every relative link (and #anchor) in README.md, ARCHITECTURE.md and docs/*.md resolves;
 * a part imports another part only through its face (`../<part>/index.js`); and the folder tables
 * of ARCHITECTURE.md and the README name exactly the folders under src/, each with the parts its
 * files really import. Each checker is also run on a planted mistake, so none can pass vacuously.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ESLint } from 'eslint';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { DEFAULT_TIMEOUT } from '../src/sandbox/index.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SRC = path.join(ROOT, 'src');
const rel = (file: string) => path.relative(ROOT, file);

// -- markdown --------------------------------------------------------------------------------

/** The markdown outside fenced code blocks and inline code spans. */
function prose(markdown: string): string {
  return markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '').replace(/`[^`\n]*`/g, '');
}

/** GitHub's anchor for a heading's text. */
function slug(heading: string): string {
  return heading
    .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '')
    .replace(/ /g, '-');
}

/** Every anchor a markdown file's headings make, duplicates numbered as GitHub does. */
function anchors(markdown: string): Set<string> {
  const made = new Set<string>();
  const withoutFences = markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '');
  for (const [, text] of withoutFences.matchAll(/^#{1,6} +(.+?) *#* *$/gm)) {
    const base = slug(text!);
    let anchor = base;
    for (let n = 1; made.has(anchor); n++) anchor = `${base}-${n}`;
    made.add(anchor);
  }
  return made;
}

/** Relative link targets: inline `[text](target)` and reference definitions `[x]: target`. */
function linkTargets(markdown: string): string[] {
  const text = prose(markdown);
  const inline = [...text.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => m[1]!);
  const defined = [...text.matchAll(/^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)/gm)].map((m) => m[1]!);
  return [...inline, ...defined].filter((target) => !/^[a-z][a-z0-9+.-]*:/i.test(target));
}

/** What is wrong with each relative link of `file` (a repository path), as messages. */
function brokenLinks(file: string, markdown: string, read: (file: string) => string): string[] {
  const problems: string[] = [];
  for (const target of linkTargets(markdown)) {
    const [pathPart, anchor] = target.split('#', 2) as [string, string | undefined];
    if (pathPart === '') {
      if (anchor !== undefined && !anchors(markdown).has(anchor))
        problems.push(`${rel(file)}: link (${target}): ${rel(file)} has no heading #${anchor}`);
      continue;
    }
    const resolved = path.join(path.dirname(file), decodeURIComponent(pathPart));
    if (!existsSync(resolved)) {
      problems.push(`${rel(file)}: link (${target}): ${rel(resolved)} does not exist`);
      continue;
    }
    if (anchor === undefined || anchor === '' || !resolved.endsWith('.md')) continue;
    if (statSync(resolved).isDirectory()) continue;
    if (!anchors(read(resolved)).has(anchor))
      problems.push(`${rel(file)}: link (${target}): ${rel(resolved)} has no heading #${anchor}`);
  }
  return problems;
}

const DOCUMENTS = [
  path.join(ROOT, 'README.md'),
  path.join(ROOT, 'ARCHITECTURE.md'),
  ...readdirSync(path.join(ROOT, 'docs'))
    .filter((name) => name.endsWith('.md'))
    .map((name) => path.join(ROOT, 'docs', name)),
];
const readText = (file: string) => readFileSync(file, 'utf8');

// -- imports ---------------------------------------------------------------------------------

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) return sourceFiles(full);
    return entry.name.endsWith('.ts') ? [full] : [];
  });
}

/** The part a file of src/ belongs to (its top folder), or undefined for a top-level file. */
function partOf(file: string): string | undefined {
  const parts = path.relative(SRC, file).split(path.sep);
  return parts.length > 1 ? parts[0] : undefined;
}

interface PartImport {
  readonly specifier: string;
  /** The part imported (another top folder of src/), if the import reaches one. */
  readonly part: string | undefined;
  /** Whether the import names that part's face exactly. */
  readonly throughFace: boolean;
}

/** Relative imports of a source file (static, re-exports, type-only and dynamic). */
function importsOf(file: string, source: string): PartImport[] {
  const own = partOf(file);
  return ts
    .preProcessFile(source, true, true)
    .importedFiles.map((f) => f.fileName)
    .filter((specifier) => specifier.startsWith('.'))
    .map((specifier) => {
      const target = path.resolve(path.dirname(file), specifier);
      const inSrc = path.relative(SRC, target).split(path.sep);
      const part =
        !inSrc[0]!.startsWith('..') && inSrc.length > 1 && inSrc[0] !== own ? inSrc[0] : undefined;
      return {
        specifier,
        part,
        throughFace: part !== undefined && target === path.join(SRC, part, 'index.js'),
      };
    });
}

/** Messages for every import of `file` that reaches into another part past its face. */
function boundaryViolations(file: string, source: string): string[] {
  return importsOf(file, source)
    .filter((i) => i.part !== undefined && !i.throughFace)
    .map(
      (i) =>
        `${rel(file)} imports '${i.specifier}', an internal of src/${i.part}/: import its face (src/${i.part}/index.js) instead`,
    );
}

const SOURCES = sourceFiles(SRC).map((file) => ({ file, source: readText(file) }));

/**
 * The file-level import graph of src/: each file (repository path) -> the files of src/ it
 * imports relatively. Type-only imports count: erased at run time, they still tie the two files
 * together for whoever reads or moves them.
 */
function fileImports(sources: readonly { file: string; source: string }[]): Map<string, string[]> {
  const known = new Set(sources.map(({ file }) => file));
  return new Map(
    sources.map(({ file, source }) => [
      rel(file),
      importsOf(file, source)
        .map((i) => path.resolve(path.dirname(file), i.specifier).replace(/\.js$/, '.ts'))
        .filter((target) => known.has(target))
        .map(rel),
    ]),
  );
}

/** Every cycle a depth-first walk of `graph` meets, each written `a -> b -> a`. */
function cycles(graph: ReadonlyMap<string, Iterable<string>>): string[] {
  const state = new Map<string, 'visiting' | 'done'>();
  const found: string[] = [];
  const visit = (node: string, trail: string[]) => {
    if (state.get(node) === 'done') return;
    if (state.get(node) === 'visiting')
      return void found.push([...trail.slice(trail.indexOf(node)), node].join(' -> '));
    state.set(node, 'visiting');
    for (const next of graph.get(node) ?? []) visit(next, [...trail, node]);
    state.set(node, 'done');
  };
  for (const node of [...graph.keys()].sort()) visit(node, []);
  return found;
}
const TOP_LEVEL = 'src/*.ts';

/** For each folder of src/ (and the top-level files), the parts its files import. */
function importedParts(): Map<string, Set<string>> {
  const byFolder = new Map<string, Set<string>>();
  for (const entry of readdirSync(SRC, { withFileTypes: true }))
    if (entry.isDirectory()) byFolder.set(`src/${entry.name}/`, new Set());
  for (const { file, source } of SOURCES) {
    const own = partOf(file);
    const key = own === undefined ? TOP_LEVEL : `src/${own}/`;
    const set = byFolder.get(key) ?? new Set<string>();
    byFolder.set(key, set);
    for (const i of importsOf(file, source)) if (i.part !== undefined) set.add(i.part);
  }
  return byFolder;
}

// -- folder tables ---------------------------------------------------------------------------

/** The folder table of a document: folder cell -> the parts its last cell names. */
function folderTable(document: string, markdown: string): Map<string, Set<string>> {
  const section = /\n## Where the code lives\n([\s\S]*?)(?=\n## |$)/.exec(markdown)?.[1];
  if (section === undefined)
    throw new Error(`${document} has no "## Where the code lives" section`);
  const table = new Map<string, Set<string>>();
  for (const [, folder, rest] of section.matchAll(/^\| *`(src\/[^`]*)` *\|(.*)\|\s*$/gm)) {
    const cells = rest!.split('|');
    const last = cells[cells.length - 1]!.trim();
    const parts = last === 'none' ? [] : [...last.matchAll(/`([a-z0-9-]+)`/g)].map((m) => m[1]!);
    table.set(folder!, new Set(parts));
  }
  return table;
}

/** Messages for every way `table` differs from `actual` (folder -> imported parts). */
function tableDifferences(
  document: string,
  table: Map<string, Set<string>>,
  actual: Map<string, Set<string>>,
): string[] {
  const problems: string[] = [];
  const list = (parts: Iterable<string>) => [...parts].sort().join(', ') || 'none';
  for (const folder of actual.keys())
    if (!table.has(folder)) problems.push(`${document}: the folder table has no row for ${folder}`);
  for (const [folder, named] of table) {
    const imported = actual.get(folder);
    if (imported === undefined) {
      problems.push(`${document}: the folder table names ${folder}, which does not exist`);
      continue;
    }
    if (list(named) !== list(imported))
      problems.push(
        `${document}: ${folder} imports ${list(imported)}, but the folder table says ${list(named)}`,
      );
  }
  return problems;
}

describe('documentation links', () => {
  it('every relative link in README.md, ARCHITECTURE.md and docs/*.md resolves, #anchors included', () => {
    const problems = DOCUMENTS.flatMap((file) => brokenLinks(file, readText(file), readText));
    expect(problems, problems.join('\n')).toEqual([]);
  });

  it('reports a missing file and a missing heading, naming the document and the link', () => {
    const file = path.join(ROOT, 'docs', 'planted.md');
    const planted = [
      '# Planted',
      '## Real heading',
      '[fine](#real-heading) [gone](nowhere.md) [no anchor](../README.md#no-such-heading) [here](#nothing)',
      '`[in code](nowhere-either.md)` [web](https://example.com/)',
    ].join('\n');
    expect(brokenLinks(file, planted, readText)).toEqual([
      'docs/planted.md: link (nowhere.md): docs/nowhere.md does not exist',
      'docs/planted.md: link (../README.md#no-such-heading): README.md has no heading #no-such-heading',
      'docs/planted.md: link (#nothing): docs/planted.md has no heading #nothing',
    ]);
  });

  it('makes anchors as GitHub does', () => {
    expect([
      ...anchors('## What `npm start` changes on your host\n## Header names with `_`\n## A\n## A'),
    ]).toEqual(['what-npm-start-changes-on-your-host', 'header-names-with-_', 'a', 'a-1']);
  });
});

/** The docs/*.md pages that no README.md link reaches (the README's Documentation list). */
function unlinkedPages(readme: string, pages: string[]): string[] {
  const linked = new Set(
    linkTargets(readme).map((target) => path.normalize(target.split('#')[0]!)),
  );
  return pages.filter((page) => !linked.has(page));
}

/** Lines of a markdown's ```sh blocks that run `moat` itself, not through npx. */
function bareMoatCommands(markdown: string): string[] {
  return [...markdown.matchAll(/^```sh\n([\s\S]*?)^```$/gm)]
    .flatMap((block) => block[1]!.split('\n'))
    .filter((line) => /(^|[|;&(]|&&|\|\|)\s*moat\s/.test(line));
}

/** The README's leak-guard sentences, which docs/secrets.md's threat model says word for word. */
const LEAK_GUARD =
  'The leak guard refuses a request carrying a stored secret to a destination whose rule does not bind it, on every request Moat reads (its head: method, target, header fields): plain HTTP through Moat, and TLS Moat intercepts. Over TLS Moat does not intercept, a secret a sandbox holds in plaintext cannot be seen, nor can one in a request body.';

/** Markdown as one line of words (wrapping and indentation ignored). */
const flat = (markdown: string) => markdown.replace(/\s+/g, ' ');

/** The ``` blocks of a markdown that make a sandbox but set no lifetime. */
function createsWithoutTimeout(markdown: string): string[] {
  return [...markdown.matchAll(/^```[a-z]*\n([\s\S]*?)^```$/gm)]
    .map((block) => block[1]!)
    .filter(
      (code) =>
        (/Sandbox\.create\(/.test(code) && !/timeoutMs:/.test(code)) ||
        (/-X POST \S*\/sandboxes\b/.test(code) && !/"timeout":/.test(code)),
    );
}

describe('the README as a front door', () => {
  it("says what the leak guard refuses and what it cannot see, as docs/secrets.md's threat model does", () => {
    const secrets = readText(path.join(ROOT, 'docs/secrets.md'));
    const threatModel = secrets.slice(
      secrets.indexOf('### Threat model'),
      secrets.indexOf('### Storage'),
    );
    for (const [document, text] of [
      ['README.md', readText(path.join(ROOT, 'README.md'))],
      ["docs/secrets.md's threat model", threatModel],
    ])
      expect(flat(text!).includes(LEAK_GUARD), `${document} says: ${LEAK_GUARD}`).toBe(true);
  });

  it('sets a lifetime wherever it makes a sandbox, and says the default once, linking operations.md', () => {
    const readme = readText(path.join(ROOT, 'README.md'));
    expect(createsWithoutTimeout(readme)).toEqual([]);
    const planted = [
      '```ts\nawait Sandbox.create({ network: {} })\n```',
      '```ts\nawait Sandbox.create({ timeoutMs: 60_000 })\n```',
      '```sh\ncurl -X POST $API/v2/sandboxes -d \'{"templateID":"base"}\'\n```',
    ].join('\n');
    expect(createsWithoutTimeout(planted)).toEqual([
      'await Sandbox.create({ network: {} })\n',
      'curl -X POST $API/v2/sandboxes -d \'{"templateID":"base"}\'\n',
    ]);
    const said = [...flat(readme).matchAll(/without it a sandbox lives (\d+) s\b.*?\.(?= |$)/g)];
    expect(said.map((m) => Number(m[1]))).toEqual([DEFAULT_TIMEOUT]);
    expect(said[0]![0]).toContain('](docs/operations.md#');
  });

  it('runs moat through npx in every command it shows (npm ci puts no moat on PATH)', () => {
    expect(bareMoatCommands(readText(path.join(ROOT, 'README.md')))).toEqual([]);
    const planted = '```sh\nmoat observe\nnpx moat check\nx || moat lint a\n```\n`moat serve`\n';
    expect(bareMoatCommands(planted)).toEqual(['moat observe', 'x || moat lint a']);
  });

  it('links every docs/ page', () => {
    const pages = readdirSync(path.join(ROOT, 'docs'))
      .filter((name) => name.endsWith('.md'))
      .map((name) => `docs/${name}`);
    expect(pages.length).toBeGreaterThan(0);
    expect(unlinkedPages(readText(path.join(ROOT, 'README.md')), pages)).toEqual([]);
    expect(unlinkedPages('[a](docs/a.md#x) `[b](docs/b.md)`', ['docs/a.md', 'docs/b.md'])).toEqual([
      'docs/b.md',
    ]);
  });

  it('names the Node.js the project installs and tests, as package.json says', () => {
    const pkg = JSON.parse(readText(path.join(ROOT, 'package.json'))) as {
      engines: { node: string };
      devDependencies: Record<string, string>;
    };
    const minimum = />=\s*(\d+)/.exec(pkg.engines.node)?.[1];
    const installed = /^\^(\d+)\./.exec(pkg.devDependencies.node ?? '')?.[1];
    const readme = readText(path.join(ROOT, 'README.md'));
    const said = /installs the project's\s+own Node (\d+) LTS/.exec(readme)?.[1];
    expect(said, 'README.md names the Node.js `npm ci` installs in Set-up').toBeDefined();
    expect([said, installed]).toEqual([minimum, minimum]);
    expect(readme).toMatch(/fast suites run again on\s+Node 24 LTS/);
  });
});

describe('import boundaries', () => {
  it('a file of one part imports another part only through its face (../<part>/index.js)', () => {
    const problems = SOURCES.flatMap(({ file, source }) => boundaryViolations(file, source));
    expect(problems, problems.join('\n')).toEqual([]);
  });

  it('no file of src/ imports itself back through another (type-only imports count)', () => {
    const found = cycles(fileImports(SOURCES));
    expect(found, found.join('\n')).toEqual([]);
  });

  it('names each file-level cycle it finds', () => {
    const planted = [
      { file: path.join(SRC, 'proxy', 'a.ts'), source: "import type { B } from './b.js';" },
      { file: path.join(SRC, 'proxy', 'b.ts'), source: "export { c } from '../c.js';" },
      { file: path.join(SRC, 'c.ts'), source: "import { a } from './proxy/a.js';" },
      { file: path.join(SRC, 'd.ts'), source: "import { c } from './c.js';" },
    ];
    expect(cycles(fileImports(planted))).toEqual([
      'src/c.ts -> src/proxy/a.ts -> src/proxy/b.ts -> src/c.ts',
    ]);
  });

  it('every part has a face', () => {
    const missing = [...importedParts().keys()]
      .filter((folder) => folder !== TOP_LEVEL && !existsSync(path.join(ROOT, folder, 'index.ts')))
      .map((folder) => `${folder} has no index.ts`);
    expect(missing, missing.join('\n')).toEqual([]);
  });

  it('reports an import past a face, from a part or a top-level file, naming file and import', () => {
    const planted = [
      "import { Interceptor } from '../dns/interceptor.js';",
      "export * from '../policy/index.js';",
      "export { x } from './own-file.js';",
      "const y = await import('../runtime/supervisor/probe.js');",
      "import type { T } from '../enforce/kernel-rules.js';",
    ].join('\n');
    expect(boundaryViolations(path.join(SRC, 'proxy', 'planted.ts'), planted)).toEqual([
      "src/proxy/planted.ts imports '../dns/interceptor.js', an internal of src/dns/: import its face (src/dns/index.js) instead",
      "src/proxy/planted.ts imports '../runtime/supervisor/probe.js', an internal of src/runtime/: import its face (src/runtime/index.js) instead",
      "src/proxy/planted.ts imports '../enforce/kernel-rules.js', an internal of src/enforce/: import its face (src/enforce/index.js) instead",
    ]);
    expect(
      boundaryViolations(
        path.join(SRC, 'planted.ts'),
        "import { a } from './store/file-store.js';",
      ),
    ).toEqual([
      "src/planted.ts imports './store/file-store.js', an internal of src/store/: import its face (src/store/index.js) instead",
    ]);
  });
});

describe('the import-boundary lint rule (eslint.config.js, from ARCHITECTURE.md)', () => {
  const lint = async (file: string, code: string) => {
    const [result] = await new ESLint({ cwd: ROOT }).lintText(code, {
      filePath: path.join(ROOT, file),
    });
    return result!.messages.map((m) => `${m.ruleId}: ${m.message}`);
  };

  it('refuses an import past a face, and a direction the table does not name', async () => {
    expect(
      await lint('src/proxy/planted.ts', "export { x } from '../dns/interceptor.js';\n"),
    ).toEqual([expect.stringMatching(/^no-restricted-imports: .*through its face/)]);
    expect(
      await lint(
        'src/policy/planted.ts',
        "import { x } from '../proxy/index.js';\nexport const y = x;\n",
      ),
    ).toEqual([expect.stringMatching(/src\/policy\/ may import no other part \(ARCHITECTURE\.md/)]);
    expect(
      await lint(
        'src/planted.ts',
        "import type { T } from './sandbox/index.js';\nexport type U = T;\n",
      ),
    ).toEqual([expect.stringMatching(/may import only dns, net, policy, process, proxy, runtime/)]);
    expect(await lint('src/net/planted.ts', "export { x } from '../runtime/index.js';\n")).toEqual([
      expect.stringMatching(/src\/net\/ may import no other part \(ARCHITECTURE\.md/),
    ]);
    // What the table allows passes.
    expect(await lint('src/proxy/planted.ts', "export { x } from '../dns/index.js';\n")).toEqual(
      [],
    );
  });

  it('holds one folder down in a part as well (src/envd/files/)', async () => {
    const planted = 'src/envd/files/planted.ts';
    expect(await lint(planted, "export { x } from '../../runtime/users.js';\n")).toEqual([
      expect.stringMatching(/^no-restricted-imports: .*through its face/),
    ]);
    expect(await lint(planted, "export { x } from '../../proxy/index.js';\n")).toEqual([
      expect.stringMatching(
        /src\/envd\/ may import only e2b-wire, net, runtime, secret-compare \(ARCHITECTURE\.md/,
      ),
    ]);
    // Its own part's files, a permitted face and the top-level files pass.
    expect(
      await lint(
        planted,
        "export { a } from '../connect.js';\nexport { b } from '../../runtime/index.js';\nexport { c } from '../../config.js';\n",
      ),
    ).toEqual([]);
  });

  it('allows no cycle: the parts the table lets import each other are layered', () => {
    const table = folderTable('ARCHITECTURE.md', readText(path.join(ROOT, 'ARCHITECTURE.md')));
    const imports = new Map(
      [...table].map(([folder, parts]) => [folder.replace(/^src\/|\/$/g, ''), parts]),
    );
    const found = cycles(imports);
    expect(found, found.join('\n')).toEqual([]);
  });
});

describe('folder tables', () => {
  const actual = importedParts();

  for (const document of ['ARCHITECTURE.md', 'README.md']) {
    it(`${document} names exactly the folders of src/, each with the parts it imports`, () => {
      const table = folderTable(document, readText(path.join(ROOT, document)));
      const problems = tableDifferences(document, table, actual);
      expect(problems, problems.join('\n')).toEqual([]);
    });
  }

  it('reports a missing row, a folder that does not exist and a wrong import list', () => {
    const planted = [
      '## Where the code lives',
      '| folder | holds | imports (faces) |',
      '|---|---|---|',
      '| `src/policy/` | rules | none |',
      '| `src/gone/` | nothing | none |',
      '| `src/dns/` | the interceptor | `policy` |',
      '## Next',
    ].join('\n');
    const table = folderTable('planted.md', `\n${planted}`);
    const reality = new Map([
      ['src/policy/', new Set<string>()],
      ['src/dns/', new Set(['enforce', 'policy'])],
      ['src/store/', new Set<string>()],
    ]);
    expect(tableDifferences('planted.md', table, reality)).toEqual([
      'planted.md: the folder table has no row for src/store/',
      'planted.md: the folder table names src/gone/, which does not exist',
      'planted.md: src/dns/ imports enforce, policy, but the folder table says policy',
    ]);
  });
});
