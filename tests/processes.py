"""Starting simjoin's long-running processes (`scheduler`, `executor`, `serve`) from Python:
each prints the address it listens on once it does (port 0 picks a free one)."""
import os
import subprocess
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIMJOIN = os.environ.get("SIMJOIN") or os.path.join(ROOT, "target", "release", "simjoin")


def start(args, env=None, timeout=60):
    """A `simjoin` process with `args` and the address it prints once listening (within `timeout`
    seconds, else RuntimeError with the end of its stderr)."""
    proc = subprocess.Popen([SIMJOIN] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not line or "listening on" not in line[0]:
        proc.kill()
        raise RuntimeError(f"simjoin {' '.join(args)} did not start: {line} {proc.stderr.read()[-2000:]}")
    # Nobody reads stderr from here on: let it go where it would not fill a pipe.
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, line[0].split("listening on ")[1].split()[0]
