# Sourced by the bench scripts.
#
# wait_for_line LOG TEXT: waits (up to a minute) for the log file LOG to
# contain TEXT and prints the first matching line; on time-out, prints the
# log to stderr and fails.
wait_for_line() {
    for _ in $(seq 1 600); do
        if grep -q "$2" "$1" 2>/dev/null; then grep -m1 "$2" "$1"; return 0; fi
        sleep 0.1
    done
    echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; return 1
}
