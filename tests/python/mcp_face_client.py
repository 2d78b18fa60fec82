"""`toolboxd mcp`, driven by the official MCP Python SDK's client.

Usage: mcp_face_client.py TARGET MODE, where TARGET is `stdio:BUS_URL` (the
client starts `toolboxd mcp --bus BUS_URL` itself; $TOOLBOXD is the
binary) or an http:// URL, and MODE is `auto` (the current revision,
found with server/discover) or `legacy` (the initialize handshake).
$RELOAD_CMD is a shell command that changes the daemon's catalog. Prints
one JSON object with what each step saw.
"""

import json
import os
import subprocess
import sys

import anyio
from mcp import Client, StdioServerParameters


async def main(target: str, mode: str) -> dict:
    seen: dict = {}
    notes: list = []

    async def on_message(message):
        # Notifications the server sends on its own (legacy era).
        method = getattr(getattr(message, "root", message), "method", None)
        if method:
            notes.append(method)

    if target.startswith("stdio:"):
        server = StdioServerParameters(command=os.environ["TOOLBOXD"],
                                       args=["mcp", "--bus", target[len("stdio:"):]])
    else:
        server = target
    async with Client(server, mode=mode, message_handler=on_message, cache=None,
                      read_timeout_seconds=30) as client:
        seen["protocol"] = client.protocol_version
        seen["server"] = client.server_info.name if client.server_info else None
        listed = await client.list_tools()
        seen["tools"] = sorted(t.name for t in listed.tools)
        add = next(t for t in listed.tools if t.name == "add")
        seen["add_schema"] = add.input_schema

        result = await client.call_tool("add", {"a": 2, "b": 3})
        seen["add"] = {"structured": result.structured_content, "is_error": result.is_error}

        progress = []

        async def on_progress(done, total, message):
            progress.append([done, total, message])

        result = await client.call_tool("flood", {"count": 6, "over_s": 1.5, "then_s": 0.3},
                                        progress_callback=on_progress)
        seen["flood"] = {"text": [c.text for c in result.content], "is_error": result.is_error,
                         "progress": progress}

        result = await client.call_tool("sqrt", {"number": -1})
        seen["tool_error"] = {"is_error": result.is_error, "text": [c.text for c in result.content]}

        try:
            await client.call_tool("no_such_tool", {})
            seen["unknown"] = "answered"
        except Exception as e:  # the SDK raises the JSON-RPC error
            seen["unknown"] = str(e)

        with anyio.move_on_after(1.0) as scope:
            await client.call_tool("forever", {})
        seen["cancelled"] = scope.cancelled_caught
        # The face serves on after a cancellation.
        result = await client.call_tool("add", {"a": 1, "b": 1})
        seen["after_cancel"] = result.structured_content

        if mode == "legacy":
            if target.startswith("stdio:"):
                subprocess.run(os.environ["RELOAD_CMD"], shell=True, check=True)
                with anyio.move_on_after(15):
                    while "notifications/tools/list_changed" not in notes:
                        await anyio.sleep(0.05)
                seen["list_changed"] = "notifications/tools/list_changed" in notes
        else:
            async with client.listen(tools_list_changed=True) as subscription:
                subprocess.run(os.environ["RELOAD_CMD"], shell=True, check=True)
                with anyio.move_on_after(15):
                    async for _event in subscription:
                        seen["list_changed"] = True
                        break
        listed = await client.list_tools()
        seen["tools_after"] = sorted(t.name for t in listed.tools)
    return seen


if __name__ == "__main__":
    print(json.dumps(anyio.run(main, sys.argv[1], sys.argv[2])), flush=True)
