//! Without a reachable cluster the operator exits with a clear message, not a panic.

use std::process::Command;

fn operator(kubeconfig: &std::path::Path, home: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nereid-operator"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("KUBECONFIG", kubeconfig)
        .env("NEREID_OPERATOR_METRICS_ADDRESS", "127.0.0.1:0")
        .output()
        .expect("the operator binary runs")
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nereid-operator-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn no_kubeconfig_is_a_clear_error() {
    let home = scratch("no-config");
    let out = operator(&home.join("missing-kubeconfig"), &home);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no Kubernetes cluster found"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn unreachable_api_server_is_a_clear_error() {
    let home = scratch("unreachable");
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let kubeconfig = home.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        r#"apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster:
    server: http://127.0.0.1:1
contexts:
- name: nowhere
  context:
    cluster: nowhere
    user: nobody
current-context: nowhere
users:
- name: nobody
  user:
    token: not-a-real-token
"#,
    )
    .unwrap();
    let out = operator(&kubeconfig, &home);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Kubernetes API server"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
