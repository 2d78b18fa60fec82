// `toolboxd mcp`, driven by the official MCP TypeScript SDK's client
// (@modelcontextprotocol/client, tests/node/package.json).
//
// Usage: node mcp_face_client.mjs TARGET MODE, where TARGET is
// `stdio:BUS_URL` ($TOOLBOXD is the binary) or an http:// URL, and MODE is
// `auto` (the current revision) or `legacy`. $RELOAD_CMD changes the
// daemon's catalog. Prints one JSON object with what each step saw.

import { execSync } from "node:child_process";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const [target, mode] = process.argv.slice(2);
const seen = {};

const client = new Client(
  { name: "toolboxd-test", version: "1.0.0" },
  { versionNegotiation: { mode } },
);
let changed = false;
client.setNotificationHandler("notifications/tools/list_changed", () => {
  changed = true;
});
const transport = target.startsWith("stdio:")
  ? new StdioClientTransport({
      command: process.env.TOOLBOXD,
      args: ["mcp", "--bus", target.slice("stdio:".length)],
    })
  : new StreamableHTTPClientTransport(new URL(target));
await client.connect(transport);
seen.protocol = client.getNegotiatedProtocolVersion();
seen.server = client.getServerVersion()?.name ?? null;

const listed = await client.listTools();
seen.tools = listed.tools.map((t) => t.name).sort();

let result = await client.callTool({ name: "add", arguments: { a: 2, b: 3 } });
seen.add = { structured: result.structuredContent, is_error: result.isError };

const progress = [];
result = await client.callTool(
  { name: "flood", arguments: { count: 6, over_s: 1.5, then_s: 0.3 } },
  { onprogress: (p) => progress.push([p.progress, p.total ?? null]) },
);
seen.flood = { is_error: result.isError, progress };

result = await client.callTool({ name: "sqrt", arguments: { number: -1 } });
seen.tool_error = { is_error: result.isError, text: result.content.map((c) => c.text) };

const abort = new AbortController();
setTimeout(() => abort.abort(), 1000);
try {
  await client.callTool({ name: "forever", arguments: {} }, { signal: abort.signal });
  seen.cancelled = false;
} catch (e) {
  seen.cancelled = abort.signal.aborted;
}
result = await client.callTool({ name: "add", arguments: { a: 1, b: 1 } });
seen.after_cancel = result.structuredContent;

if (mode === "auto") {
  const subscription = await client.listen({ toolsListChanged: true });
  execSync(process.env.RELOAD_CMD);
  const deadline = Date.now() + 15000;
  while (!changed && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
  }
  seen.list_changed = changed;
  await subscription.close();
}
await client.close();
console.log(JSON.stringify(seen));
process.exit(0);
