"""The toolboxd-ask skill on a real bus, with a scripted person: it answers
toolboxd's questions as a device would, the microphone replaced by the
words given on the command line (one per question; then silence). Prints
"ready" when it listens. Run by tests/asking.rs."""

import sys
import time

from ovos_bus_client import MessageBusClient

from ovos_skill_toolboxd_ask import ToolboxdAskSkill

port, heard = int(sys.argv[1]), list(sys.argv[2:])
bus = MessageBusClient(host="127.0.0.1", port=port, route="/core", ssl=False)
bus.run_in_thread()
bus.connected_event.wait(20)
skill = ToolboxdAskSkill(skill_id="ovos-skill-toolboxd-ask.openvoiceos", bus=bus)


def get_response(dialog="", data=None, validator=None, on_fail=None, num_retries=-1):
    print("asked:", dialog, flush=True)
    return heard.pop(0) if heard else None


skill.get_response = get_response
skill.speak = lambda utterance, *args, **kwargs: print("said:", utterance, flush=True)
print("ready", flush=True)
while True:
    time.sleep(1)
