"""Runs the stock Python messagebus (ovos-messagebus) for the benchmark, on an
ephemeral loopback port: python_bus.py prints the port, then serves.

This is `python -m ovos_messagebus` (same handler, tornado application and
service logger) except for the listening socket: the stock entry point takes
its port from mycroft.conf and refuses port 0, so the benchmark binds port 0
here and reads the port back instead of guessing a free one."""
from ovos_messagebus.event_handler import MessageBusEventHandler
from ovos_utils.log import init_service_logger
from ovos_utils.process_utils import reset_sigint_handler
from tornado import httpserver, ioloop, netutil, web

reset_sigint_handler()
init_service_logger("bus")
application = web.Application([("/core", MessageBusEventHandler)])
sockets = netutil.bind_sockets(0, "127.0.0.1")
server = httpserver.HTTPServer(application)
server.add_sockets(sockets)
print(sockets[0].getsockname()[1], flush=True)
ioloop.IOLoop.current().start()
