// A protected HTTP resource by the contract of docs/fencing-token-http.md,
// in memory: PUT /items/{id} with a Fencing-Token header, GET /items/{id}.

import { createServer, type Server } from "node:http";
import { once } from "node:events";
import { MAX_TOKEN } from "../src/index.js";

export async function startResource(): Promise<{ url: string; close: () => Promise<void> }> {
  const highest = new Map<string, bigint>();
  const values = new Map<string, string>();
  const server: Server = createServer((req, res) => {
    const key = (req.url ?? "").replace(/^\/items\//, "");
    const json = (status: number, doc: unknown) => {
      res.writeHead(status, { "Content-Type": "application/json" });
      res.end(JSON.stringify(doc, (_k, v) => (typeof v === "bigint" ? Number(v) : v)));
    };
    if (req.method === "GET") {
      values.has(key) ? json(200, { value: values.get(key) }) : json(404, { error: { code: "not_found", message: key } });
      return;
    }
    let body = "";
    req.setEncoding("utf8").on("data", (d: string) => (body += d));
    req.on("end", () => {
      // node joins repeated headers with ", ": a comma is not a digit. A
      // token above MAX_TOKEN, admitted, would be the highest for good.
      const raw = req.headers["fencing-token"];
      if (typeof raw !== "string" || !/^[0-9]{1,20}$/.test(raw) || BigInt(raw) === 0n || BigInt(raw) > MAX_TOKEN) {
        json(400, { error: { code: "invalid_argument", message: `Fencing-Token ${JSON.stringify(raw)}: want one decimal token` } });
        return;
      }
      const token = BigInt(raw);
      const h = highest.get(key) ?? 0n;
      // Admit and write in one synchronous step: nothing runs in between.
      if (token < h) {
        json(409, { error: { code: "stale", message: `fence: stale token ${token} for "${key}": highest admitted is ${h}` } });
        return;
      }
      highest.set(key, token);
      values.set(key, body);
      json(200, { value: body });
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const addr = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${addr.port}/items/`,
    close: async () => {
      server.closeAllConnections();
      server.close();
      await once(server, "close");
    },
  };
}
