/* A small, safe Markdown renderer for model output and KB text.
 *
 * Safety comes from the order of work: the whole source is HTML-escaped first
 * (& < > " '), so no character of it can open a tag or leave an attribute; only
 * then are the few constructs below turned into tags this file writes itself.
 * Links are made only for http(s) URLs. Anything else stays visible as text.
 *
 * Subset: paragraphs, line breaks, headings, **bold**, *italic*, `code`, fenced
 * code blocks, bullet and numbered lists, > quotes, [text](https://…) and bare
 * https:// links.
 */
(function (root) {
  "use strict";

  var ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, function (ch) { return ESCAPES[ch]; });
  }

  // Placeholders keep finished pieces (code spans, links) away from later rules.
  // NUL cannot come from the source: it is removed before anything else.
  var HOLE = "\u0000";

  function renderInline(escaped) {
    var held = [];
    function hold(html) {
      held.push(html);
      return HOLE + (held.length - 1) + HOLE;
    }

    var text = escaped.replace(/`([^`\n]+)`/g, function (_, code) {
      return hold("<code>" + code + "</code>");
    });
    text = text.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s()\u0000]+)\)/g, function (_, label, url) {
      return hold(anchor(url, emphasis(label)));
    });
    // Bare URLs. The source's quotes and brackets are entities by now, so stop there.
    text = text.replace(/\bhttps?:\/\/(?:(?!&quot;|&#39;|&lt;|&gt;)[^\s\u0000])+/g, function (url) {
      var trail = /(?:[.,;:!?)\]]|&amp;)+$/.exec(url);
      var tail = trail ? trail[0] : "";
      var bare = tail ? url.slice(0, -tail.length) : url;
      return hold(anchor(bare, bare)) + tail;
    });
    text = emphasis(text);
    // Labels may hold code spans, so restore until no hole is left.
    for (var guard = 0; text.indexOf(HOLE) !== -1 && guard < 5; guard++) {
      text = text.replace(/\u0000(\d+)\u0000/g, function (_, n) { return held[Number(n)]; });
    }
    return text;
  }

  function anchor(url, labelHtml) {
    return '<a href="' + url + '" rel="noopener noreferrer" target="_blank">' + labelHtml + "</a>";
  }

  function emphasis(text) {
    return text
      .replace(/\*\*(?=\S)([^\n]*?\S)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^\w])__(?=\S)([^\n]*?\S)__(?!\w)/g, "$1<strong>$2</strong>")
      .replace(/(^|[^*\w])\*(?=[^\s*])([^*\n]*?[^\s*])\*(?!\*)/g, "$1<em>$2</em>")
      .replace(/(^|[^\w])_(?=[^\s_])([^_\n]*?[^\s_])_(?!\w)/g, "$1<em>$2</em>");
  }

  var FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+-]*)/;
  var HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  var BULLET = /^\s*[-*+]\s+(.*)$/;
  var NUMBERED = /^\s*(\d{1,9})[.)]\s+(.*)$/;
  var QUOTE = /^\s{0,3}&gt;\s?(.*)$/;

  function renderMarkdown(source) {
    var lines = escapeHtml(String(source == null ? "" : source).replace(/\u0000/g, "").replace(/\r\n?/g, "\n"))
      .split("\n");
    var out = [];
    var paragraph = [];

    function flushParagraph() {
      if (paragraph.length) {
        out.push("<p>" + paragraph.map(renderInline).join("<br>") + "</p>");
        paragraph = [];
      }
    }

    var i = 0;
    while (i < lines.length) {
      var line = lines[i];
      var match;

      if ((match = FENCE.exec(line))) {
        flushParagraph();
        var marker = match[1];
        var code = [];
        i++;
        // An unclosed fence (an answer still streaming) runs to the end.
        while (i < lines.length && lines[i].trim().indexOf(marker) !== 0) {
          code.push(lines[i]);
          i++;
        }
        i++;
        var lang = match[2] ? ' data-lang="' + match[2] + '"' : "";
        out.push("<pre><code" + lang + ">" + code.join("\n") + "</code></pre>");
        continue;
      }
      if ((match = HEADING.exec(line))) {
        flushParagraph();
        // Inside a chat bubble: # is the largest heading the page lets an answer have.
        var level = Math.min(6, match[1].length + 2);
        out.push("<h" + level + ">" + renderInline(match[2]) + "</h" + level + ">");
        i++;
        continue;
      }
      if (BULLET.test(line) || NUMBERED.test(line)) {
        flushParagraph();
        var ordered = !BULLET.test(line);
        var pattern = ordered ? NUMBERED : BULLET;
        var items = [];
        var start = ordered ? Number(NUMBERED.exec(line)[1]) : 1;
        while (i < lines.length && (match = pattern.exec(lines[i]))) {
          items.push("<li>" + renderInline(ordered ? match[2] : match[1]) + "</li>");
          i++;
          // A wrapped continuation line belongs to the item before it.
          while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !BULLET.test(lines[i]) &&
                 !NUMBERED.test(lines[i])) {
            items[items.length - 1] = items[items.length - 1].replace(/<\/li>$/, "<br>" +
              renderInline(lines[i].trim()) + "</li>");
            i++;
          }
        }
        var open = ordered ? (start !== 1 ? '<ol start="' + start + '">' : "<ol>") : "<ul>";
        out.push(open + items.join("") + (ordered ? "</ol>" : "</ul>"));
        continue;
      }
      if (QUOTE.test(line)) {
        flushParagraph();
        var quoted = [];
        while (i < lines.length && (match = QUOTE.exec(lines[i]))) {
          quoted.push(renderInline(match[1]));
          i++;
        }
        out.push("<blockquote><p>" + quoted.join("<br>") + "</p></blockquote>");
        continue;
      }
      if (!line.trim()) {
        flushParagraph();
        i++;
        continue;
      }
      paragraph.push(line);
      i++;
    }
    flushParagraph();
    return out.join("");
  }

  root.GatewayMarkdown = { escapeHtml: escapeHtml, render: renderMarkdown };
})(window);
