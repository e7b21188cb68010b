/**
 * Bring a rendered list up to date in place, the nodes that did not change kept as they are.
 *
 * The sidebar renders its whole list again on every listing. Swapping every node would lose
 * a click whose mouse-down landed on a button that a refresh replaced before its mouse-up, and
 * the focus and hover with it. Here a node equal to its new version (`isEqualNode`: tag,
 * attributes, text and children) stays in the document; a container that changed keeps its
 * node and has its attributes and children brought up to date; a control (a button, an input)
 * that changed is replaced, since its handlers were made for its old arguments.
 *
 * Children are matched by `data-cluster-id`, else by tag and class in their order.
 */

const REPLACED_WHEN_CHANGED = new Set(['BUTTON', 'INPUT', 'SELECT', 'TEXTAREA', 'A']);

/** Make `parent`'s children look like `wanted`, moving as few nodes as it can. */
export function morphChildren(parent: Node, wanted: readonly Node[]): void {
  const current = new Map(keyed(Array.from(parent.childNodes)));
  const next = keyed(wanted).map(([key, node]) => {
    const old = current.get(key);
    return old ? morph(old, node) : node;
  });
  next.forEach((node, index) => {
    const there = parent.childNodes[index] ?? null;
    if (there !== node) {
      parent.insertBefore(node, there);
    }
  });
  while (parent.childNodes.length > next.length) {
    parent.removeChild(parent.lastChild as Node);
  }
}

/** The node to keep in the document for `old`, now looking like `fresh`. */
function morph(old: Node, fresh: Node): Node {
  if (old.nodeType !== fresh.nodeType || old.nodeName !== fresh.nodeName) {
    return fresh;
  }
  if (old.isEqualNode(fresh)) {
    return old;
  }
  if (!(old instanceof Element) || !(fresh instanceof Element)) {
    old.textContent = fresh.textContent;
    return old;
  }
  if (REPLACED_WHEN_CHANGED.has(old.tagName)) {
    return fresh;
  }
  copyAttributes(old, fresh);
  morphChildren(old, Array.from(fresh.childNodes));
  return old;
}

function copyAttributes(target: Element, source: Element): void {
  for (const name of target.getAttributeNames()) {
    if (!source.hasAttribute(name)) {
      target.removeAttribute(name);
    }
  }
  for (const name of source.getAttributeNames()) {
    const value = source.getAttribute(name) as string;
    if (target.getAttribute(name) !== value) {
      target.setAttribute(name, value);
    }
  }
}

/** Each node with its key: its cluster's id, else its tag, class and rank among its likes. */
function keyed(nodes: readonly Node[]): Array<[string, Node]> {
  const seen = new Map<string, number>();
  return nodes.map((node): [string, Node] => {
    const id = node instanceof HTMLElement ? node.dataset.clusterId : undefined;
    if (id !== undefined) {
      return [`id:${id}`, node];
    }
    const kind = `${node.nodeName}.${node instanceof Element ? node.className : ''}`;
    const rank = seen.get(kind) ?? 0;
    seen.set(kind, rank + 1);
    return [`${kind}#${rank}`, node];
  });
}
