//! The process node's command line: a mistake in the node list is refused
//! before anything touches the cluster or the host's routes.

use std::process::Command;

#[test]
fn a_malformed_node_is_refused_with_the_flag_named() {
    let output = Command::new(env!("CARGO_BIN_EXE_nereid-proc-node"))
        .args([
            "--kubeconfig",
            "/nonexistent",
            "--bin-dir",
            "/nonexistent",
            "--state-dir",
            "/nonexistent",
        ])
        .args([
            "--bind-shim",
            "/nonexistent",
            "--api-server",
            "127.0.0.1:1",
            "--api-ca",
            "/nonexistent",
        ])
        .args(["--nodes", "proc-0,proc-gpu:gpus=four"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--nodes") && stderr.contains("expected NAME or NAME:gpu=N, got 'proc-gpu:gpus=four'"),
        "{stderr}"
    );
}
