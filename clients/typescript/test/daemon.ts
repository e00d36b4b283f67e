// A real fenced daemon for the tests: built from this repository (or
// $FENCED_BIN), started on a free port, stopped by its owner.

import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import { once } from "node:events";
import { createInterface } from "node:readline";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");
let built: string | undefined;

/** $FENCED_BIN, or fenced built once from this repository with go build. */
export function fencedBin(): string {
  if (process.env.FENCED_BIN) return process.env.FENCED_BIN;
  if (!built) {
    const out = join(mkdtempSync(join(tmpdir(), "fenced-ts-")), "fenced");
    execFileSync("go", ["build", "-o", out, "./cmd/fenced"], { cwd: repo, stdio: "inherit" });
    built = out;
  }
  return built;
}

/** A name unique to this run, valid as a lock name. */
export function unique(prefix = "ts"): string {
  return `${prefix}-${randomBytes(6).toString("hex")}`;
}

/** fenced ARGS --listen 127.0.0.1:0, with url from its first line. */
export class Daemon {
  readonly proc: ChildProcess;
  url = "";
  stderr = "";

  private constructor(args: string[]) {
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("FENCED_")));
    this.proc = spawn(fencedBin(), [...args, "--listen", "127.0.0.1:0"], { env, stdio: ["ignore", "pipe", "pipe"] });
    this.proc.stderr!.setEncoding("utf8").on("data", (d: string) => (this.stderr += d));
  }

  static async start(...args: string[]): Promise<Daemon> {
    const d = new Daemon(args);
    const lines = createInterface({ input: d.proc.stdout! });
    const timeout = AbortSignal.timeout(60_000);
    try {
      const [line] = (await Promise.race([
        once(lines, "line", { signal: timeout }),
        once(d.proc, "exit").then(() => {
          throw new Error(`fenced ${args.join(" ")} exited:\n${d.stderr}`);
        }),
      ])) as [string];
      const m = /^fenced listening on (\S+)$/.exec(line);
      if (!m) throw new Error(`fenced ${args.join(" ")}: first line ${JSON.stringify(line)}`);
      d.url = m[1];
      lines.on("line", () => {}); // keep reading stdout
      return d;
    } catch (e) {
      await d.stop();
      throw e;
    }
  }

  /** Freeze the process (SIGSTOP): requests hang unanswered. */
  pause(): void {
    this.proc.kill("SIGSTOP");
  }

  resume(): void {
    this.proc.kill("SIGCONT");
  }

  /** SIGTERM, then SIGKILL after 10 s; waits for the exit. Safe to call twice. */
  async stop(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = once(this.proc, "exit");
    this.proc.kill("SIGCONT");
    this.proc.kill("SIGTERM");
    const timer = setTimeout(() => this.proc.kill("SIGKILL"), 10_000);
    await exited;
    clearTimeout(timer);
  }
}
