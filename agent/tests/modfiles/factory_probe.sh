#!/bin/sh
# The exec'd twin of factory_probe.py (tests/test_factory.py): what a non-Python runner sees.
# argv: run --spec S --workdir W --out O
w="$5"
{
  echo "argv: $*"
  echo "cwd: $(pwd)"
  echo "umask: $(umask)"
  grep -E '^(NoNewPrivs|Seccomp|Seccomp_filters|Cap(Inh|Prm|Eff|Bnd|Amb)|Sig(Blk|Ign|Cgt)):' /proc/self/status
  echo "env:"; env | sort
  echo "fds:"; for f in /proc/self/fd/*; do echo "$(basename "$f") $(readlink "$f" | sed 's/:\[[0-9]*\]//')"; done
  echo "limits:"; cat /proc/self/limits
  echo "session: $(cut -d' ' -f5,6 /proc/self/stat) pid $$"
} > "$w/probe.txt" 2>&1
printf '{"envelope": 1, "payload": {"ok": true}}' > "$7"
