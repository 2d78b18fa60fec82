"""Turn plain Python functions into an MCP stdio toolbox. Standard library only.

    from mcp_toolbox import Toolbox

    box = Toolbox("math")

    @box.tool(input_schema={...}, output_schema={...})
    def add(a, b):
        "Add two integers."
        return {"result": a + b}

    box.run()

The toolbox speaks both MCP eras (the supervisor picks one):
- modern (2026-07-28): stateless; answers ``server/discover``; every result has
  ``resultType``;
- legacy (2025-11-25 and older): ``initialize`` then ``notifications/initialized``.

Each ``tools/call`` runs on a worker thread, so a slow tool never delays a fast
one. A tool returns a dict (its structured output, checked by the supervisor
against ``output_schema``) or, without an output schema, anything printable.
An exception becomes an error whose text starts with its class name
(``ValueError: ...``): that is what the caller on the bus sees. A long tool
can say how far it is with ``box.progress(done, total, "message")``: the
caller on the bus sees it as a progress message.

Logging goes to stderr; stdout carries only protocol lines.
"""

import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

MODERN = ["2026-07-28"]
LEGACY = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]

METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
UNSUPPORTED_PROTOCOL_VERSION = -32022


class Toolbox:
    def __init__(self, name, version="0.1.0", workers=16, page_size=None, out=None):
        self.name = name
        self.version = version
        self.page_size = page_size
        self._tools = {}
        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._write_lock = threading.Lock()
        # Where protocol lines go: stdout unless given (a host that points
        # stdout at stderr, for a library that logs there, gives the real one).
        self._out = out
        # The progress token of the call each worker thread is running.
        self._calls = threading.local()
        # Set MCP_TOOLBOX_RECORD to a file path to log every request received.
        self._record = os.environ.get("MCP_TOOLBOX_RECORD")

    def tool(self, name=None, description=None, input_schema=None, output_schema=None):
        """Decorator: register ``fn`` as a tool; its docstring is the description."""
        def register(fn):
            self.add_tool(fn, name, description, input_schema, output_schema)
            return fn
        return register

    def add_tool(self, fn, name=None, description=None, input_schema=None, output_schema=None):
        spec = {
            "name": name or fn.__name__,
            "description": description or (fn.__doc__ or "").strip(),
            "inputSchema": input_schema or {"type": "object", "properties": {}},
        }
        if output_schema is not None:
            spec["outputSchema"] = output_schema
        self._tools[spec["name"]] = (fn, spec)

    def progress(self, progress, total=None, message=None):
        """Inside a tool: report how far its call is (MCP notifications/progress).
        Does nothing when the caller asked for no progress."""
        token = getattr(self._calls, "progress_token", None)
        if token is None:
            return
        params = {"progressToken": token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        self._send({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})

    # -- wire -------------------------------------------------------------

    def _send(self, message):
        line = json.dumps(message, separators=(",", ":"))
        out = self._out or sys.stdout
        with self._write_lock:
            out.write(line + "\n")
            out.flush()

    def _result(self, msg_id, result, modern):
        if modern:
            result = dict(result, resultType="complete")
        self._send({"jsonrpc": "2.0", "id": msg_id, "result": result})

    def _error(self, msg_id, code, message, data=None):
        error = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        self._send({"jsonrpc": "2.0", "id": msg_id, "error": error})

    def run(self):
        """Serve requests from stdin until it closes."""
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError:
                print(f"[{self.name}] ignoring a line that is not JSON", file=sys.stderr)
                continue
            if self._record:
                with open(self._record, "a") as f:
                    f.write(json.dumps({"method": message.get("method"),
                                        "params": message.get("params")}) + "\n")
            self._handle(message)
        self._pool.shutdown(wait=True)

    def _handle(self, message):
        method = message.get("method")
        msg_id = message.get("id")
        params = message.get("params") or {}
        if msg_id is None or method is None:
            return  # notifications (initialized, cancelled, ...) and stray answers
        meta = params.get("_meta") or {}
        version = meta.get("io.modelcontextprotocol/protocolVersion")
        modern = version is not None
        if modern and version not in MODERN:
            self._error(msg_id, UNSUPPORTED_PROTOCOL_VERSION,
                        f"unsupported protocol version {version}",
                        {"supported": MODERN, "requested": version})
            return
        if method == "server/discover":
            self._result(msg_id, {
                "supportedVersions": MODERN + LEGACY,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": self.name, "version": self.version},
            }, modern=True)
        elif method == "initialize":
            asked = params.get("protocolVersion")
            self._result(msg_id, {
                "protocolVersion": asked if asked in LEGACY else LEGACY[0],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": self.name, "version": self.version},
            }, modern=False)
        elif method == "ping":
            self._result(msg_id, {}, modern)
        elif method == "tools/list":
            self._list(msg_id, params, modern)
        elif method == "tools/call":
            self._pool.submit(self._call, msg_id, params, modern)
        else:
            self._error(msg_id, METHOD_NOT_FOUND, f"method not found: {method}")

    def _list(self, msg_id, params, modern):
        specs = [spec for _, spec in self._tools.values()]
        start = int(params.get("cursor") or 0)
        end = len(specs) if not self.page_size else start + self.page_size
        result = {"tools": specs[start:end]}
        if end < len(specs):
            result["nextCursor"] = str(end)
        self._result(msg_id, result, modern)

    def _call(self, msg_id, params, modern):
        name = params.get("name")
        if name not in self._tools:
            self._error(msg_id, INVALID_PARAMS, f"Unknown tool: {name}")
            return
        self._result(msg_id, self._run(params), modern)

    def _run(self, params):
        """Runs the tool ``params`` names; its CallToolResult."""
        fn, spec = self._tools[params.get("name")]
        self._calls.progress_token = (params.get("_meta") or {}).get("progressToken")
        try:
            output = fn(**(params.get("arguments") or {}))
        except Exception as e:  # the tool raised: report it, keep serving
            text = f"{type(e).__name__}: {e}"
            return {"content": [{"type": "text", "text": text}], "isError": True}
        finally:
            self._calls.progress_token = None
        if "outputSchema" in spec:
            return {"content": [{"type": "text", "text": json.dumps(output)}],
                    "structuredContent": output}
        text = output if isinstance(output, str) else json.dumps(output)
        return {"content": [{"type": "text", "text": text}]}
