#!/usr/bin/env python3
"""Serve an installed OVOS ToolBox plugin as an MCP stdio toolbox.

    python3 opm_host.py ENTRY_POINT_NAME

loads the ``opm.agents.toolbox`` entry point ENTRY_POINT_NAME (an
ovos-plugin-manager ToolBox: ``discover_tools()`` returning AgentTools with
pydantic argument and output models) and serves its tools over MCP stdio, so
an existing OVOS toolbox runs under toolboxd in its own process:

    id = "my-math-tools"
    command = "python3"          # the Python environment the plugin is installed in
    args = ["opm_host.py", "my-math-tools"]

Each tool's schemas are its pydantic models' JSON Schemas; its result is the
output model dumped to JSON. A tool that raises reaches the caller as
``ExceptionClass: message`` of the tool's own exception. The plugin gets no
messagebus: toolboxd answers the bus for it.
"""

import os
import sys
from importlib.metadata import entry_points

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcp_toolbox import Toolbox  # noqa: E402

GROUP = "opm.agents.toolbox"


def load(name):
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        names = sorted(ep.name for ep in entry_points(group=GROUP))
        sys.exit(f"opm_host: no {GROUP} entry point named {name!r}; installed: {names}")
    cls = found[0].load()
    try:
        return cls(toolbox_id=name, config={})
    except TypeError:
        # Plugins that fix their own id take only config (and bus).
        return cls(config={})


def serve(name):
    plugin = load(name)
    plugin.refresh_tools()
    box = Toolbox(name)
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
    if len(sys.argv) != 2:
        sys.exit("usage: opm_host.py ENTRY_POINT_NAME")
    serve(sys.argv[1])
