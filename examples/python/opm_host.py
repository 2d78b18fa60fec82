#!/usr/bin/env python3
"""Serve an installed OVOS ToolBox plugin as an MCP stdio toolbox.

    python3 opm_host.py ENTRY_POINT_NAME [CONFIG]

loads the ``opm.agents.toolbox`` entry point ENTRY_POINT_NAME (an
ovos-plugin-manager ToolBox: ``discover_tools()`` returning AgentTools with
pydantic argument and output models) and serves its tools over MCP stdio, so
an existing OVOS toolbox runs under toolboxd in its own process:

    id = "my-math-tools"
    command = "python3"          # the Python environment the plugin is installed in
    args = ["opm_host.py", "my-math-tools"]

CONFIG, when given, is the plugin's configuration: a JSON object, or
``@PATH`` of a file holding one (``args = ["opm_host.py", "my-tools",
'{"api_url": "http://127.0.0.1:8080"}']``); without it the plugin gets
``{}``. Each tool's schemas are its pydantic models' JSON Schemas; its
result is the output model dumped to JSON. A tool that raises reaches the
caller as ``ExceptionClass: message`` of the tool's own exception. The
plugin gets no messagebus: toolboxd answers the bus for it.

stdout carries the protocol only: whatever the plugin prints or logs (the
OVOS logger writes to stdout) goes to stderr, which toolboxd logs and keeps
for ``toolboxd ctl logs``.
"""

import json
import os
import sys
from importlib.metadata import entry_points

# The protocol keeps the real stdout; from here on fd 1, and sys.stdout,
# are stderr, before any plugin (or the OVOS logger) is imported.
PROTOCOL = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcp_toolbox import Toolbox  # noqa: E402

GROUP = "opm.agents.toolbox"


def config_of(text):
    """The plugin's configuration from CONFIG: JSON, or @PATH of JSON."""
    if text is None:
        return {}
    source = "CONFIG"
    if text.startswith("@"):
        source = text[1:]
        try:
            with open(source) as f:
                text = f.read()
        except OSError as e:
            sys.exit(f"opm_host: cannot read the plugin's configuration {source}: {e}")
    try:
        config = json.loads(text)
    except ValueError as e:
        sys.exit(f"opm_host: the plugin's configuration ({source}) is not JSON: {e}")
    if not isinstance(config, dict):
        sys.exit(f"opm_host: the plugin's configuration ({source}) must be a JSON object")
    return config


def load(name, config):
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        names = sorted(ep.name for ep in entry_points(group=GROUP))
        sys.exit(f"opm_host: no {GROUP} entry point named {name!r}; installed: {names}")
    cls = found[0].load()
    try:
        return cls(toolbox_id=name, config=config)
    except TypeError:
        # Plugins that fix their own id take only config (and bus).
        return cls(config=config)


def serve(name, config):
    plugin = load(name, config)
    plugin.refresh_tools()
    if not plugin.tools:
        print(f"opm_host: the plugin {name!r} serves no tools (does it need a configuration? "
              "pass it as the second argument)", file=sys.stderr, flush=True)
    box = Toolbox(name, out=PROTOCOL)
    for tool in plugin.tools.values():
        def call(_tool=tool, **kwargs):
            try:
                output = plugin.call_tool(_tool.name, kwargs)
            except Exception as e:
                # call_tool wraps the tool's exception: report the tool's own.
                raise (e.__cause__ or e) from None
            return output.model_dump(mode="json")
        box.add_tool(call, name=tool.name, description=tool.description,
                      input_schema=tool.argument_schema.model_json_schema(),
                      output_schema=tool.output_schema.model_json_schema())
    box.run()


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: opm_host.py ENTRY_POINT_NAME [CONFIG: JSON, or @PATH]")
    serve(sys.argv[1], config_of(sys.argv[2] if len(sys.argv) == 3 else None))
