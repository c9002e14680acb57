//! The LD_PRELOAD shim that gives each pod its own IP: a wildcard bind
//! lands on `$NEREID_POD_IP`, any other bind is left alone. Checked with a
//! real program binding real sockets, on loopback addresses (127.0.0.0/8 is
//! local without the pod range's route, so no privilege is needed).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the shim the way e2e/cluster.sh does.
fn shim() -> PathBuf {
    let out = std::env::temp_dir().join(format!("nereid-bind-shim-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let library = out.join("bind-pod-ip.so");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("bind_pod_ip.c");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .status()
        .expect("cc (e2e/cluster.sh needs it too)");
    assert!(status.success(), "compiling {}", source.display());
    library
}

/// Where a socket bound to `host` port 0 ends up, under the shim.
fn bound_address(library: &Path, pod_ip: &str, host: &str) -> String {
    let output = Command::new("python3")
        .args([
            "-c",
            "import socket, sys\ns = socket.socket()\ns.bind((sys.argv[1], 0))\nprint(s.getsockname()[0])",
            host,
        ])
        .env("LD_PRELOAD", library)
        .env("NEREID_POD_IP", pod_ip)
        .output()
        .expect("python3");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

#[test]
fn wildcard_binds_land_on_the_pod_ip_and_others_pass_through() {
    let library = shim();
    assert_eq!(bound_address(&library, "127.0.0.7", "0.0.0.0"), "127.0.0.7");
    assert_eq!(bound_address(&library, "127.0.0.7", "127.0.0.1"), "127.0.0.1");
    // Two "pods" on one port: each its own IP, as with network namespaces.
    let first = std::net::TcpListener::bind("127.0.0.8:0").unwrap();
    let port = first.local_addr().unwrap().port();
    let output = Command::new("python3")
        .args([
            "-c",
            "import socket, sys\ns = socket.socket()\ns.bind(('0.0.0.0', int(sys.argv[1])))\nprint(s.getsockname()[0])",
            &port.to_string(),
        ])
        .env("LD_PRELOAD", &library)
        .env("NEREID_POD_IP", "127.0.0.9")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "127.0.0.9");
    let _ = std::fs::remove_dir_all(library.parent().unwrap());
}

#[test]
fn listed_service_names_resolve_to_their_address_and_others_pass_through() {
    let library = shim();
    let hosts = std::env::temp_dir().join(format!("nereid-service-hosts-{}", std::process::id()));
    std::fs::write(&hosts, "echo.ml.svc.cluster.local 127.0.0.42\necho.ml.svc 127.0.0.42\n").unwrap();
    let resolve = |name: &str| {
        let output = Command::new("python3")
            .args([
                "-c",
                "import socket, sys\nprint(socket.getaddrinfo(sys.argv[1], 8001, socket.AF_INET)[0][4][0])",
                name,
            ])
            .env("LD_PRELOAD", &library)
            .env("NEREID_SERVICE_HOSTS", &hosts)
            .output()
            .expect("python3");
        assert!(
            output.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    assert_eq!(resolve("echo.ml.svc.cluster.local"), "127.0.0.42");
    assert_eq!(resolve("echo.ml.svc"), "127.0.0.42");
    assert_eq!(resolve("localhost"), "127.0.0.1", "names not listed resolve as always");
    let _ = std::fs::remove_file(&hosts);
}
