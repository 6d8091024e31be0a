// Renders Markdown in node the way the chat page does, for tests/chat/test_markdown.py.
//
//   node render_markdown.js SCRIPT... < sources.json > results.json
//
// The page's scripts (given in the order the page loads them) run in one fresh context whose
// `window` is that context itself, as in a browser. There is no DOM here, so what comes out is
// GatewayMarkdown.toHtml: the renderer's own HTML, before the page's sanitizer (the browser
// test covers that layer). Each result carries the time its render took, in milliseconds.
"use strict";

const fs = require("fs");
const vm = require("vm");

const context = vm.createContext({});
vm.runInContext("var window = this;", context);
for (const path of process.argv.slice(2)) {
  vm.runInContext(fs.readFileSync(path, "utf8"), context, { filename: path });
}
const markdown = context.window.GatewayMarkdown;
const sources = JSON.parse(fs.readFileSync(0, "utf8"));
const results = sources.map((source) => {
  const started = process.hrtime.bigint();
  const html = markdown.toHtml(source);
  return { html, ms: Number(process.hrtime.bigint() - started) / 1e6 };
});
process.stdout.write(JSON.stringify(results));
