// ESLint for the gateway's own JavaScript: `make lint-js` (or `npx eslint .`).
//
// CommonJS, because package.json sets no "type": tests/chat/render_markdown.js is a CommonJS
// script that node runs as it is.
"use strict";

const js = require("@eslint/js");
const globals = require("globals");

module.exports = [
  {
    // Not ours or not source: the virtualenv (Django's admin, the API docs' bundles), local
    // state and collected static files (var/, STATIC_ROOT's default), npm's packages, and the
    // libraries vendored minified beside the chat (see their README).
    ignores: [".venv/", "var/", "node_modules/", "chat/static/chat/vendor/"],
  },
  js.configs.recommended,
  {
    rules: {
      "no-var": "error",
      "prefer-const": "error",
      eqeqeq: "error",
      "no-implicit-globals": "error",
    },
  },
  {
    // The pages' scripts, in every app's static/. api.js and markdown.js are classic scripts
    // that publish one global on window each (markdown.js also runs in node's vm, for
    // tests/chat/test_markdown.py); the chat's others are ES modules.
    files: ["*/static/**/*.js"],
    languageOptions: { sourceType: "script", globals: globals.browser },
  },
  {
    files: ["chat/static/chat/dom.js", "chat/static/chat/keys.js", "chat/static/chat/chat/*.js"],
    languageOptions: { sourceType: "module" },
  },
  {
    // Run by node: this file and the tests' helpers.
    files: ["eslint.config.js", "tests/**/*.js"],
    languageOptions: { sourceType: "commonjs", globals: globals.node },
  },
];
