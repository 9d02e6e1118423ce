/**
 * A trie of domain names keyed by labels from the right (com -> example -> api), holding exact
 * rules and `*.` wildcard rules. A wildcard at `example.com` matches any name with at least one
 * more label below it, never `example.com` itself.
 */

interface DomainNode<T> {
  children: Map<string, DomainNode<T>> | null;
  exact: T | undefined;
  wildcard: T | undefined;
}

const newNode = <T>(): DomainNode<T> => ({ children: null, exact: undefined, wildcard: undefined });

export class DomainTrie<T> {
  private readonly root: DomainNode<T> = newNode();
  private count = 0;

  get size(): number {
    return this.count;
  }

  /** Adds a rule for a canonical name; the first rule for a name and kind wins. */
  insert(name: string, kind: 'exact' | 'wildcard', value: T): boolean {
    let node = this.root;
    for (const label of name.split('.').reverse()) {
      node.children ??= new Map();
      let child = node.children.get(label);
      if (!child) {
        child = newNode();
        node.children.set(label, child);
      }
      node = child;
    }
    if (node[kind] !== undefined) return false;
    node[kind] = value;
    this.count++;
    return true;
  }

  /**
   * The most specific rule covering a canonical name: an exact rule for the name itself, else
   * the wildcard of the nearest ancestor.
   */
  lookup(name: string): T | undefined {
    let node = this.root;
    let best: T | undefined;
    let end = name.length;
    for (;;) {
      const dot = name.lastIndexOf('.', end - 1);
      const next = node.children?.get(name.slice(dot + 1, end));
      if (next === undefined) return best;
      if (dot < 0) return next.exact ?? best;
      if (next.wildcard !== undefined) best = next.wildcard;
      node = next;
      end = dot;
    }
  }
}
