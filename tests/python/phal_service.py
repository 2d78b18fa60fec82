"""Runs ovos-PHAL-plugin-tools, the Python tool service toolboxd replaces, on a
bus, with every installed ToolBox plugin (here `test-math-tools`):

    phal_service.py HOST PORT

Prints "ready" and the toolbox ids once the service is bound to the bus."""
import sys
import time

from ovos_bus_client import MessageBusClient
from ovos_phal_plugin_tools import OVOSToolsPHALPlugin

host, port = sys.argv[1], int(sys.argv[2])
bus = MessageBusClient(host=host, port=port, route="/core")
bus.run_in_thread()
if not bus.connected_event.wait(20):
    sys.exit(f"phal_service: no bus at {host}:{port}")
plugin = OVOSToolsPHALPlugin(bus=bus)
print("ready", " ".join(sorted(plugin._toolboxes)), flush=True)
while True:
    time.sleep(3600)
