"""Runs the Python tool service that toolboxd replaces (ovos-PHAL-plugin-tools)
on a bus, for the side-by-side benchmark: python_service.py HOST PORT."""
import sys
import time

from ovos_bus_client import MessageBusClient
from ovos_phal_plugin_tools import OVOSToolsPHALPlugin

host, port = sys.argv[1], int(sys.argv[2])
bus = MessageBusClient(host=host, port=port, route="/core")
bus.run_in_thread()
bus.connected_event.wait()
plugin = OVOSToolsPHALPlugin(bus=bus)
print("ready", flush=True)
while True:
    time.sleep(3600)
