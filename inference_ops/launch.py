"""Start an engine detached from the caller: `python -m inference_ops.launch LOG -- ARGV...`.

The engine runs in its own session (so its whole tree can be signalled by
session id) and is not a child of the Celery worker that asked for it: a
worker restart neither kills the engine nor leaves it a zombie. Prints the
engine's pid and exits.
"""

import datetime
import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m inference_ops.launch LOG -- ARGV...", file=sys.stderr)
        return 2
    log_path, command = argv[0], argv[2:]
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    with open(log_path, "ab", buffering=0) as log:
        stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        log.write(f"\n=== {stamp} starting: {' '.join(command)}\n".encode())
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            log.write(f"=== could not start: {exc}\n".encode())
            print(f"error: {exc}", file=sys.stderr)
            return 1
    print(process.pid, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
