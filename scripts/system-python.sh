# Sourced by scripts/test and scripts/bench: sets $python, the interpreter the
# test environments are made from and that `python3` names. Under a root
# daemon every toolbox runs as a user of its own, which must be able to run
# it: the system's Python, not one in root's private home (pyenv's, say).
python=python3
if [ "$(id -u)" = 0 ]; then
  for candidate in /usr/bin/python3 /usr/local/bin/python3; do
    if [ -x "$candidate" ]; then python=$candidate; break; fi
  done
fi
if [ "$python" != python3 ]; then
  PATH="$(dirname "$python"):$PATH"
  export PATH
fi
