// An MCP client (official TypeScript SDK: Client + StreamableHTTPClientTransport)
// that runs a script of steps; the same contract as client.py.
//
//   node client.mjs --url URL --script FILE_OR_JSON [--timeout S] [--step-timeout S]
//                   [--header "Name: value" ...]
//
// Steps: {"call": name, "args": {...}} | {"list_tools": true} | {"sleep": s}.
// {"call": ..., "progress": true} passes an onprogress callback (the SDK then
// sends params._meta.progressToken).
// One JSON line per call/list step:
//   {"step": i, "tool": name, "is_error": bool, "text": first text or null,
//    "texts": every text block, in order,
//    "structured": structuredContent or null, "exception": null or "Type: message", "code": int or null}
//   {"step": i, "tools": [names]}
// A failing step is recorded and the script goes on. The whole run is bounded by
// --timeout (then {"timeout": true}, exit 2); a failed connect prints
// {"step": "connect", ...} and exits 1; otherwise exit 0.
// --header (repeatable) adds an HTTP header to every request the client sends.

import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

function parseArgs(argv) {
  const opts = { timeout: 60, stepTimeout: undefined, headers: {} };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const v = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === "--url") opts.url = v();
    else if (a === "--script") opts.script = v();
    else if (a === "--timeout") opts.timeout = Number(v());
    else if (a === "--step-timeout") opts.stepTimeout = Number(v());
    else if (a === "--header") {
      const h = v();
      const at = h.indexOf(":");
      if (at <= 0) throw new Error(`--header: 'Name: value', not ${JSON.stringify(h)}`);
      opts.headers[h.slice(0, at).trim()] = h.slice(at + 1).trim();
    }
    else throw new Error(`unknown argument ${a}`);
  }
  if (!opts.url || !opts.script) throw new Error("usage: node client.mjs --url URL --script FILE_OR_JSON [--timeout S]");
  if (opts.stepTimeout === undefined) opts.stepTimeout = Math.min(10, opts.timeout);
  return opts;
}

function loadScript(arg) {
  const text = arg.trimStart().startsWith("[") ? arg : readFileSync(arg, "utf8");
  const script = JSON.parse(text);
  if (!Array.isArray(script)) throw new Error("--script: a JSON list of steps");
  return script;
}

const emit = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const describe = (e) => `${e?.constructor?.name ?? "Error"}: ${e?.message ?? String(e)}`;
const errorCode = (e) => (Number.isInteger(e?.code) ? e.code : null);

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const script = loadScript(opts.script);
  setTimeout(() => {
    emit({ timeout: true });
    process.exit(2);
  }, opts.timeout * 1000);

  const client = new Client({ name: "loopguard-e2e-ts", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), { requestInit: { headers: opts.headers } });
  try {
    await client.connect(transport, { timeout: opts.stepTimeout * 1000 });
  } catch (e) {
    emit({ step: "connect", exception: describe(e), code: errorCode(e) });
    process.exit(1);
  }
  const reqOpts = { timeout: opts.stepTimeout * 1000 };

  for (const [i, step] of script.entries()) {
    if ("sleep" in step) {
      await new Promise((r) => setTimeout(r, Number(step.sleep) * 1000));
    } else if (step.list_tools) {
      try {
        const res = await client.listTools(undefined, reqOpts);
        emit({ step: i, tools: res.tools.map((t) => t.name) });
      } catch (e) {
        emit({ step: i, tools: null, exception: describe(e), code: errorCode(e) });
      }
    } else if ("call" in step) {
      const line = { step: i, tool: step.call, is_error: false, text: null, texts: [], structured: null, exception: null, code: null };
      try {
        const callOpts = step.progress ? { ...reqOpts, onprogress: () => {} } : reqOpts;
        const res = await client.callTool({ name: step.call, arguments: step.args ?? {} }, undefined, callOpts);
        line.is_error = Boolean(res.isError);
        line.texts = (res.content ?? []).filter((c) => c.type === "text").map((c) => c.text);
        line.text = line.texts.length ? line.texts[0] : null;
        line.structured = res.structuredContent ?? null;
      } catch (e) {
        line.exception = describe(e);
        line.code = errorCode(e);
      }
      emit(line);
    } else {
      emit({ step: i, exception: `Error: unknown step ${JSON.stringify(step)}` });
    }
  }
  try {
    await client.close();
  } catch {
    // closing must not change the outcome
  }
  process.exit(0);
}

main().catch((e) => {
  process.stderr.write(`${describe(e)}\n`);
  process.exit(1);
});
