#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 600) each, one after the other,
# starting from the committed seeds; new inputs go to corpus/<target> (not
# committed), crashes to artifacts/<target>. Prints one line per target with
# libFuzzer's final stats. Needs the nightly toolchain and cargo-fuzz.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${SECONDS_PER_TARGET:-600}
targets=${*:-http_infer_body json_tensor_data grpc_infer_request grpc_stream_messages control_body generate_body gateway_request bytes_elements decompress config_pbtxt config_json}
for target in $targets; do
    mkdir -p "fuzz/corpus/$target"
    log="fuzz/artifacts/$target.log"
    mkdir -p fuzz/artifacts
    # The gRPC decoders get inputs up to 64 KiB: an amplification (2 wire
    # bytes, hundreds decoded) shows only past libFuzzer's default 4 KiB.
    case $target in
        grpc_*) max_len=65536 ;;
        *) max_len=4096 ;;
    esac
    cargo +nightly fuzz run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
        -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 >"$log" 2>&1
    status=$?
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    rss=$(grep -E '^stat::peak_rss_mb' "$log" | awk '{print $2}')
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
    crash=$(grep -oE 'Test unit written to \S+' "$log" | tail -1)
    echo "$target: exit $status, ${runs:-?} runs, ${cov:-cov ?}, peak RSS ${rss:-?} MB, ${crash:-no crash}"
done
