"""Runs the Python tool service that toolboxd replaces (ovos-PHAL-plugin-tools)
on a bus, for the side-by-side benchmark:

    python_service.py HOST PORT [TOOLBOXES]

It loads every installed ToolBox plugin (here the test plugin `test-math-tools`,
with `add` and `divide`), as the service does. TOOLBOXES > 1 adds more
instances of each plugin under other ids (`test-math-tools-2`, ...), bound to
the bus like the first, for comparing memory at the same number of toolboxes."""
import sys
import time

from ovos_bus_client import MessageBusClient
from ovos_plugin_manager.persona import find_toolbox_plugins
from ovos_phal_plugin_tools import OVOSToolsPHALPlugin

host, port = sys.argv[1], int(sys.argv[2])
count = int(sys.argv[3]) if len(sys.argv) > 3 else 1
bus = MessageBusClient(host=host, port=port, route="/core")
bus.run_in_thread()
bus.connected_event.wait()
plugin = OVOSToolsPHALPlugin(bus=bus)
for ep_name, cls in find_toolbox_plugins().items():
    for i in range(2, count + 1):
        toolbox_id = f"{ep_name}-{i}"
        try:
            tb = cls(config={}, bus=bus, toolbox_id=toolbox_id)
        except TypeError:
            sys.exit(f"python_service: plugin {ep_name} takes no toolbox_id; cannot add copies")
        plugin._toolboxes[toolbox_id] = tb
        for tool_name in tb.tools:
            plugin._tool_registry[tool_name] = tb
print("ready", len(plugin._toolboxes), flush=True)
while True:
    time.sleep(3600)
