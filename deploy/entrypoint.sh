#!/bin/sh
# The image's entry point: `sh deploy/entrypoint.sh COMMAND...`.
#
# Every process of a container counts its metrics into PROMETHEUS_MULTIPROC_DIR and a scrape adds
# up every file there, so the files of processes from an earlier start (a restarted container keeps
# its Kubernetes emptyDir) would stay in the sums forever, a killed process's in-flight requests
# among them. The folder is this container's alone: empty it, then become the command.
set -eu
if [ -n "${PROMETHEUS_MULTIPROC_DIR:-}" ] && [ -d "$PROMETHEUS_MULTIPROC_DIR" ]; then
    find "$PROMETHEUS_MULTIPROC_DIR" -maxdepth 1 -name '*.db' -delete
fi
exec "$@"
