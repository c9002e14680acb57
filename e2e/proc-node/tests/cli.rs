//! The process node's command line: a mistake in the node list is refused
//! before anything touches the cluster or the network, and so is a start
//! outside the namespaces e2e/netns.sh makes.

use std::process::Command;

/// The process node with flags that name nothing real, and `nodes`.
fn proc_node(nodes: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nereid-proc-node"));
    command
        .args([
            "--kubeconfig",
            "/nonexistent",
            "--bin-dir",
            "/nonexistent",
            "--state-dir",
            "/nonexistent",
        ])
        .args(["--api-server", "127.0.0.1:1", "--api-ca", "/nonexistent"])
        .args(["--nodes", nodes]);
    command
}

#[test]
fn a_malformed_node_is_refused_with_the_flag_named() {
    let output = proc_node("proc-0,proc-gpu:gpus=four").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--nodes") && stderr.contains("expected NAME or NAME:gpu=N, got 'proc-gpu:gpus=four'"),
        "{stderr}"
    );
}

/// The tests run in the machine's own namespaces: the node must not make a
/// bridge or set a sysctl there.
#[test]
fn outside_the_e2e_namespace_the_node_touches_no_network() {
    let output = proc_node("proc-0").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("not inside e2e/netns.sh's namespaces"), "{stderr}");
}
