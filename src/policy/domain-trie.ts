/**
 * Name rules: exact names and `*.` wildcards. A wildcard at `example.com` matches any name
 * with at least one more label below it, never `example.com` itself.
 *
 * Kept as two hash maps keyed by whole names rather than a tree of labels: an exact match is
 * one lookup, and a wildcard match looks up only the suffixes whose label count some wildcard
 * has (usually one or two), deepest first. No per-label strings are made for the rest.
 */

export class DomainTrie<T> {
  private readonly exact = new Map<string, T>();
  private readonly wildcards = new Map<string, T>();
  /** depths[n] is true when some wildcard domain has n labels. */
  private readonly depths: boolean[] = [];
  private minDepth = Number.POSITIVE_INFINITY;
  private maxDepth = 0;

  get size(): number {
    return this.exact.size + this.wildcards.size;
  }

  /** Adds a rule for a canonical name; the first rule for a name and kind wins. */
  insert(name: string, kind: 'exact' | 'wildcard', value: T): boolean {
    const map = kind === 'exact' ? this.exact : this.wildcards;
    if (map.has(name)) return false;
    map.set(name, value);
    if (kind === 'wildcard') {
      const depth = name.split('.').length;
      this.depths[depth] = true;
      this.minDepth = Math.min(this.minDepth, depth);
      this.maxDepth = Math.max(this.maxDepth, depth);
    }
    return true;
  }

  /**
   * The most specific rule covering a canonical name: an exact rule for the name itself, else
   * the wildcard of the nearest ancestor.
   */
  lookup(name: string): T | undefined {
    const exact = this.exact.get(name);
    if (exact !== undefined || this.wildcards.size === 0) return exact;
    // The loop of findWildcard without a callback: this is every host decision's path.
    let labels = 1;
    for (let i = 0; i < name.length; i++) if (name.charCodeAt(i) === 46) labels++;
    let depth = labels - 1;
    let dot = name.indexOf('.');
    while (dot >= 0 && depth >= this.minDepth) {
      if (depth <= this.maxDepth && this.depths[depth] === true) {
        const match = this.wildcards.get(name.slice(dot + 1));
        if (match !== undefined) return match;
      }
      dot = name.indexOf('.', dot + 1);
      depth--;
    }
    return undefined;
  }

  /**
   * The first `pick` result, most specific rule first (exact, then wildcards from the nearest
   * ancestor out), that is not undefined: for rules that cover a name only on some ports.
   */
  find<R>(name: string, pick: (value: T) => R | undefined): R | undefined {
    const exact = this.exact.get(name);
    const picked = exact === undefined ? undefined : pick(exact);
    if (picked !== undefined || this.wildcards.size === 0) return picked;
    return this.findWildcard(name, pick);
  }

  private findWildcard<R>(name: string, pick: (value: T) => R | undefined): R | undefined {
    let labels = 1;
    for (let i = 0; i < name.length; i++) if (name.charCodeAt(i) === 46) labels++;
    // Suffixes strictly shorter than the name, deepest first, at depths some wildcard has.
    let depth = labels - 1;
    let dot = name.indexOf('.');
    while (dot >= 0 && depth >= this.minDepth) {
      if (depth <= this.maxDepth && this.depths[depth] === true) {
        const match = this.wildcards.get(name.slice(dot + 1));
        const picked = match === undefined ? undefined : pick(match);
        if (picked !== undefined) return picked;
      }
      dot = name.indexOf('.', dot + 1);
      depth--;
    }
    return undefined;
  }
}
