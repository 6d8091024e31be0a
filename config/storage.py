"""Static files as served in production: WhiteNoise's compressed, hashed files, with the chat's
ES modules importing each other by their hashed names too. Django hashes the file a template
names (`boot.<hash>.js`); without this its `import … from "./page.js"` would fetch the plain name,
which a browser may keep cached from the last deploy and pair with the new entry point."""

from whitenoise.storage import CompressedManifestStaticFilesStorage


class StaticFilesStorage(CompressedManifestStaticFilesStorage):
    support_js_module_import_aggregation = True
