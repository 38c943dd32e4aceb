#!/bin/sh
# The runner image's entrypoint: wait for the pool's Docker daemon, then run the runner.
#
# A pool that provides Docker (a docker-in-docker sidecar) sets DOCKER_HOST. The runner
# must not register before that daemon answers, or its first job fails on `docker build`
# (BACK-10). ZOOMIES_DOCKER_WAIT is how long to wait: whole seconds from 1 to 3600, 120 by
# default here; the controller renders runners.docker_wait (180 s) into every Docker pool.
#
# Exit codes the agent turns into a sentence on the Runners page (BACK-13, BACK-14):
#   69 (EX_UNAVAILABLE)  the daemon never answered within the wait
#   78 (EX_CONFIG)       ZOOMIES_DOCKER_WAIT is not a whole number from 1 to 3600
# An image without a docker client only warns (BACK-15): the job may never touch Docker.
#
# POSIX sh: runs under the actions-runner image's dash/bash and under busybox's ash.
set -u

say() { echo "zoomies-entrypoint: $*" >&2; }

if [ -n "${DOCKER_HOST:-}" ]; then
    wait_s="${ZOOMIES_DOCKER_WAIT:-120}"
    case "$wait_s" in
        '' | *[!0-9]* | ?????*)
            say "ZOOMIES_DOCKER_WAIT=${wait_s} is not a whole number of seconds from 1 to 3600"
            exit 78
            ;;
    esac
    # Strip leading zeros so the shell never reads 0120 as octal.
    wait_s=$(echo "$wait_s" | sed 's/^0*//')
    if [ -z "$wait_s" ] || [ "$wait_s" -lt 1 ] || [ "$wait_s" -gt 3600 ]; then
        say "ZOOMIES_DOCKER_WAIT=${ZOOMIES_DOCKER_WAIT} is not a whole number of seconds from 1 to 3600"
        exit 78
    fi
    if ! command -v docker >/dev/null 2>&1; then
        say "warning: this image has no docker client, so it cannot wait for ${DOCKER_HOST};" \
            "jobs that use Docker need the image's Docker variant"
    else
        say "waiting up to ${wait_s} s for the Docker daemon at ${DOCKER_HOST}"
        start=$(date +%s)
        while :; do
            now=$(date +%s)
            left=$((start + wait_s - now))
            if [ "$left" -le 0 ]; then
                say "the Docker daemon at ${DOCKER_HOST} did not answer within ${wait_s} s;" \
                    "exiting before the runner can take a job"
                exit 69
            fi
            # Each probe is bounded to 5 s, and never past the end of the wait.
            probe=5
            [ "$left" -lt "$probe" ] && probe=$left
            if timeout "$probe" docker info >/dev/null 2>&1; then
                say "the Docker daemon at ${DOCKER_HOST} answered after $((now - start)) s"
                break
            fi
            sleep 1
        done
    fi
fi

# A non-ephemeral pool's runner (SCHED-15): configured once with its registration token, at
# the web URL of where it registers, with exactly the pool's labels, then run as usual. An
# ephemeral runner carries its JIT configuration instead and skips this.
if [ -n "${ZOOMIES_RUNNER_TOKEN:-}" ] && [ -z "${ACTIONS_RUNNER_INPUT_JITCONFIG:-}" ]; then
    token=$ZOOMIES_RUNNER_TOKEN
    unset ZOOMIES_RUNNER_TOKEN  # not for the jobs to read
    say "configuring ${ZOOMIES_RUNNER_NAME} at ${ZOOMIES_RUNNER_URL}"
    ./config.sh --unattended --url "$ZOOMIES_RUNNER_URL" --token "$token" \
        --name "$ZOOMIES_RUNNER_NAME" --labels "$ZOOMIES_RUNNER_LABELS" --no-default-labels \
        --replace --disableupdate || { say "config.sh failed"; exit 78; }
fi

exec "$@"
