# Sourced by the bench scripts: the processes a script starts, stopped by
# their PIDs and by nothing else.
#
# pids: each process the script starts (pids+=($!)).
# stop PID: SIGTERM, then wait for it.
# stop_started: stops every PID in pids, all signalled first (the scripts'
# EXIT trap).
pids=()
stop() {
    kill -TERM "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
stop_started() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
