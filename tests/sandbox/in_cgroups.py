"""Run a command inside cgroups, as a node's runtime starts a container in the cgroup it made.

    python in_cgroups.py <cgroup.procs> [<cgroup.procs> ...] -- <command> [args ...]
"""

import os
import sys

if __name__ == "__main__":
    split = sys.argv.index("--")
    for procs in sys.argv[1:split]:
        with open(procs, "w") as fh:
            fh.write("0")
    os.execvp(sys.argv[split + 1], sys.argv[split + 1:])
