/* digits-memplugin: words explained where scripts draw them (MemPlugin.term), as templates/memplugin/terms.html
 * draws them on the server: the word linked to its entry on the glossary page, the entry's first line as its title.
 * The texts come from the page (<script id="mp-glossary">, digits_memplugin/web/pages/glossary.py); a word without an entry,
 * or a page without them, gets plain text. */
(function () {
  "use strict";

  const MP = window.MemPlugin;
  const node = document.getElementById("mp-glossary");
  const entries = node ? JSON.parse(node.textContent) : {};
  const url = node ? node.dataset.url : "";
  const ALIASES = { "cgroup v1": "cgroup_v1", "cgroup v2": "cgroup_v2" };

  /** The entry of a word as the pages show it (glossary.find), or null. */
  function find(word) {
    if (!word) return null;
    const key = ALIASES[word] || word;
    if (Object.prototype.hasOwnProperty.call(entries, key)) return { key, ...entries[key] };
    const lower = key.toLowerCase();
    if (Object.prototype.hasOwnProperty.call(entries, lower)) return { key: lower, ...entries[lower] };
    return null;
  }

  /** The word (or `text`) as a link to its entry, or a text node when it has none. */
  function term(word, text) {
    const entry = find(word);
    const shown = text === undefined ? String(word) : String(text);
    if (!entry) return document.createTextNode(shown);
    return MP.el("a", { className: "mp-term", href: url + "#" + entry.anchor, title: entry.short, dataset: { term: entry.key } },
      shown);
  }

  MP.term = term;
  MP.glossary = { find, term };
})();
