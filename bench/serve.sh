# Sourced by the bench scripts that start nereid-server: the one command
# line they start it with, and where it says it listens.

source "$(dirname "${BASH_SOURCE[0]}")/wait_for_line.sh"

# nereid-server's flags for listening on free ports of 127.0.0.1 only; the
# log says which ports it took (server_addresses reads them).
local_ports=(--http-address 127.0.0.1 --http-port 0 --grpc-address 127.0.0.1 --grpc-port 0 --metrics-port 0)

# server_addresses LOG: waits until the server logging to LOG listens on
# both protocols, and sets http and grpc to their host:port.
server_addresses() {
    http=$(wait_for_line "$1" "Started HTTPService" | sed -E 's/.*at ([0-9.:]+).*/\1/')
    grpc=$(wait_for_line "$1" "Started GRPCInferenceService" | sed -E 's/.*at ([0-9.:]+).*/\1/')
}
