/* Markdown for model output and KB text: markdown-it renders, DOMPurify keeps only what it wrote.
 *
 * Both libraries are vendored in vendor/ (see its README: versions, licenses, no CDN) and load
 * before this file. Three layers stand between an answer's text and a running script:
 *
 * 1. markdown-it, configured below: raw HTML off (every character it does not turn into its own
 *    tags is escaped), links only for http(s) URLs, no images, table alignment as a class
 *    rather than an inline style. Its parser is CommonMark's: no string splicing of earlier
 *    output (the hand-written renderer this replaces pasted markup into an attribute through a
 *    `$'` in the text), and linear on pathological input.
 * 2. DOMPurify parses that HTML in an inert document and drops every element, attribute or
 *    value outside ALLOWED: a bug in layer 1 still yields no script, handler or javascript: URL.
 * 3. The page's Content-Security-Policy (script-src 'self', no inline handlers).
 *
 * Streaming: the whole answer is rendered again as tokens arrive; an unclosed code fence runs
 * to the end of the text, so a half-written code block shows as code.
 */
(function (root) {
  "use strict";

  // The tags the chat shows, each with the attributes (and the values) it may keep.
  const LANG = /^[A-Za-z0-9_+#.-]{1,32}$/;
  const ALIGN = { left: "align-left", center: "align-center", right: "align-right" };
  const ALIGN_CLASS = /^align-(left|center|right)$/;
  const HTTP = /^https?:\/\//i;
  const ALLOWED = {
    p: {}, br: {}, strong: {}, em: {}, s: {}, pre: {}, blockquote: {}, hr: {},
    h3: {}, h4: {}, h5: {}, h6: {}, ul: {}, li: {},
    table: {}, thead: {}, tbody: {}, tr: {},
    code: { "data-lang": LANG },
    ol: { start: /^\d{1,9}$/ },
    th: { "class": ALIGN_CLASS },
    td: { "class": ALIGN_CLASS },
    a: { href: HTTP, title: /[^]*/, rel: /^noopener noreferrer$/, target: /^_blank$/ },
  };
  // Inside a chat bubble, # is the largest heading an answer may have.
  const HEADING_SHIFT = 2;

  const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, function (ch) { return ESCAPES[ch]; });
  }

  function makeRenderer(markdownit) {
    const md = markdownit("default", { html: false, linkify: true, breaks: true, typographer: false });
    md.disable(["image"]);
    // Only scheme-prefixed URLs become links: with fuzzy matching `manage.py` would be one.
    md.linkify.set({ fuzzyLink: false, fuzzyEmail: false, fuzzyIP: false });
    // Called with the normalized (percent-encoded) URL of every link, autolink and linkified URL.
    md.validateLink = function (url) { return HTTP.test(url); };

    md.core.ruler.push("gateway_markup", function (state) {
      state.tokens.forEach(function (token) {
        if (token.type === "heading_open" || token.type === "heading_close") {
          token.tag = "h" + Math.min(6, Number(token.tag.slice(1)) + HEADING_SHIFT);
        } else if (token.type === "th_open" || token.type === "td_open") {
          // The page's CSP allows no inline style: alignment becomes a class of chat.css.
          const align = /text-align:\s*(left|center|right)/.exec(token.attrGet("style") || "");
          token.attrs = align ? [["class", ALIGN[align[1]]]] : null;
        }
      });
    });

    md.renderer.rules.link_open = function (tokens, idx, options, env, self) {
      tokens[idx].attrSet("rel", "noopener noreferrer");
      tokens[idx].attrSet("target", "_blank");
      return self.renderToken(tokens, idx, options);
    };
    md.renderer.rules.fence = function (tokens, idx) {
      const token = tokens[idx];
      const lang = token.info.trim().split(/\s+/)[0];
      // Only a plain name: the attribute then holds nothing an escaper would have to handle.
      const attribute = LANG.test(lang) ? ' data-lang="' + lang + '"' : "";
      return "<pre><code" + attribute + ">" + md.utils.escapeHtml(token.content) + "</code></pre>\n";
    };
    return md;
  }

  function makeSanitizer(createDOMPurify) {
    // An instance of our own, so its hooks touch no other user of DOMPurify on the page.
    const purify = createDOMPurify(root);
    if (!purify.isSupported) return null;
    const attributes = {};
    Object.keys(ALLOWED).forEach(function (tag) {
      Object.keys(ALLOWED[tag]).forEach(function (name) { attributes[name] = true; });
    });
    purify.addHook("uponSanitizeAttribute", function (node, data) {
      const rule = (ALLOWED[node.nodeName.toLowerCase()] || {})[data.attrName];
      if (!rule || !rule.test(data.attrValue)) data.keepAttr = false;
    });
    const config = {
      ALLOWED_TAGS: Object.keys(ALLOWED),
      ALLOWED_ATTR: Object.keys(attributes),
      ALLOWED_URI_REGEXP: HTTP,
      // DOMPurify tests every other attribute's value against that URI pattern too; the hook
      // above already holds each of these to its own pattern.
      ADD_URI_SAFE_ATTR: ["rel", "target", "start", "data-lang"],
      ALLOW_DATA_ATTR: false,
      ALLOW_ARIA_ATTR: false,
    };
    return function (html) { return purify.sanitize(html, config); };
  }

  const md = root.markdownit ? makeRenderer(root.markdownit) : null;
  const sanitize = root.DOMPurify ? makeSanitizer(root.DOMPurify) : null;

  /* The renderer's HTML before the sanitizer: for the tests in node, which have no DOM. */
  function toHtml(source) {
    return md.render(String(source ?? ""));
  }

  /* What the page puts in innerHTML. Without both libraries (a file failed to load) the text
   * is shown escaped, unformatted: never unsanitized. */
  function render(source) {
    if (!md || !sanitize) return "<p>" + escapeHtml(source ?? "") + "</p>";
    return sanitize(toHtml(source));
  }

  root.GatewayMarkdown = { escapeHtml: escapeHtml, render: render, toHtml: toHtml };
})(window);
