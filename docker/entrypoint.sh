#!/usr/bin/env bash
# Entry point of the STAPO image.
#   head                 start a Ray head node in the foreground (launch/ray/start_head.sh)
#   worker               join a Ray cluster in the foreground; needs RAY_HEAD_ADDRESS=<head>:6379
#   doctor [args...]     `stapo doctor` preflight against the cluster (RAY_ADDRESS or --address)
#   train [overrides...] run `python -m recipe.stapo.main_stapo` directly (single node, no Ray cluster)
#   submit [overrides...] submit the recipe to a running cluster as a Ray job (launch/ray/submit.sh)
#   help                 this text
#   <anything else>      run it as a command, e.g. `bash`, `ray status`, `stapo eval ...`
# Ray and network settings are environment variables: see launch/README.md.
set -euo pipefail

STAPO_HOME="${STAPO_HOME:-/opt/stapo}"
LAUNCH="$STAPO_HOME/launch/ray"

usage() {
  sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

mode="${1:-help}"
if (($#)); then
  shift
fi
case "$mode" in
  head)
    export RAY_BLOCK="${RAY_BLOCK:-1}"
    exec bash "$LAUNCH/start_head.sh" "$@"
    ;;
  worker)
    export RAY_BLOCK="${RAY_BLOCK:-1}"
    exec bash "$LAUNCH/start_worker.sh" "$@"
    ;;
  doctor)
    exec stapo doctor "$@"
    ;;
  train)
    cd "$STAPO_HOME"
    exec python3 -m recipe.stapo.main_stapo "$@"
    ;;
  submit)
    exec bash "$LAUNCH/submit.sh" "$@"
    ;;
  help | -h | --help)
    usage
    ;;
  *)
    exec "$mode" "$@"
    ;;
esac
