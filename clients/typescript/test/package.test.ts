// The package as a user installs it: `npm pack` of what `npm run build`
// made, installed into a project of its own, imported by its name from
// JavaScript and from TypeScript, and used against a real fenced dev. A
// wrong "exports", "main", "types" or "files" passes every other test,
// which imports ../src/index.js directly.

import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { Daemon, unique } from "./daemon.js";

const pkgDir = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

function run(cmd: string, args: string[], cwd: string): string {
  return execFileSync(cmd, args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

describe("the packed package", () => {
  let d: Daemon;
  let project: string;

  before(async () => {
    d = await Daemon.start("dev");
    project = mkdtempSync(join(tmpdir(), "fenced-ts-pkg-"));
    // --ignore-scripts: npm test built dist/ already, and rebuilding it
    // here would rewrite the test files other test processes are reading.
    run("npm", ["pack", "--ignore-scripts", "--silent", "--pack-destination", project], pkgDir);
    const [tgz] = readdirSync(project).filter((f) => f.endsWith(".tgz"));
    assert.ok(tgz, "npm pack wrote no tarball");
    writeFileSync(join(project, "package.json"), JSON.stringify({ name: "user", private: true, type: "module" }));
    run("npm", ["install", "--offline", "--no-audit", "--no-fund", "--loglevel=error", `./${tgz}`], project);
  });
  after(async () => {
    await d?.stop();
    if (project) rmSync(project, { recursive: true, force: true });
  });

  it("holds only the compiled client", () => {
    const files = run("npm", ["pack", "--dry-run", "--json", "--ignore-scripts"], pkgDir);
    const paths = (JSON.parse(files)[0].files as { path: string }[]).map((f) => f.path).sort();
    assert.ok(paths.includes("dist/src/index.js") && paths.includes("dist/src/index.d.ts"), paths.join(", "));
    // The source too, which the source maps point to.
    assert.ok(paths.includes("src/index.ts"), paths.join(", "));
    assert.deepEqual(paths.filter((p) => !/^(dist\/src\/|src\/index\.ts$|package\.json$|README\.md$)/.test(p)), []);
  });

  it("is imported by its name and takes a lock", () => {
    const script = join(project, "use.mjs");
    writeFileSync(
      script,
      `import { Client, HeldError } from "@fenced/client";
const client = new Client(process.argv[2]);
const lease = await client.acquire(process.argv[3], { ttlMs: 5000 });
const other = await client.tryAcquire(process.argv[3], { ttlMs: 5000 });
await lease.release();
console.log(JSON.stringify({ token: String(lease.token), held: other !== null, heldError: typeof HeldError }));
`,
    );
    const out = JSON.parse(run("node", [script, d.url, unique("pkg")], project));
    assert.match(out.token, /^[1-9][0-9]*$/);
    assert.equal(out.held, false);
    assert.equal(out.heldError, "function");
  });

  it("gives TypeScript its types", () => {
    writeFileSync(
      join(project, "use.ts"),
      `import { Client, type Lease } from "@fenced/client";
const client: Client = new Client("http://127.0.0.1:7070");
export async function take(): Promise<bigint> {
  const lease: Lease = await client.acquire("x", { ttlMs: 5000 });
  return lease.token;
}
// @ts-expect-error: ttlMs is a number
client.tryAcquire("x", { ttlMs: "5s" });
`,
    );
    writeFileSync(
      join(project, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          target: "ES2022",
          module: "NodeNext",
          moduleResolution: "NodeNext",
          strict: true,
          noEmit: true,
          types: ["node"],
          typeRoots: [join(pkgDir, "node_modules", "@types")],
        },
        files: ["use.ts"],
      }),
    );
    // The compiler of this package's devDependencies; a type that did not
    // resolve ("any") would fail the @ts-expect-error line.
    run("node", [join(pkgDir, "node_modules", "typescript", "bin", "tsc"), "-p", "."], project);
  });
});
