//! The committed CRD YAML (Helm chart and plain manifests) must be exactly
//! what the Rust types generate today.

use std::path::{Path, PathBuf};

/// Committed copies of `crd_yaml()`, relative to the workspace root.
const COMMITTED: [&str; 2] = ["charts/nereid/crds/nereid-crds.yaml", "deploy/crds/nereid-crds.yaml"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// 1-based number and both versions of the first line that differs.
fn first_difference(committed: &str, generated: &str) -> (usize, String, String) {
    let mut committed_lines = committed.lines();
    let mut generated_lines = generated.lines();
    for n in 1.. {
        let (c, g) = (committed_lines.next(), generated_lines.next());
        if c != g {
            let show = |l: Option<&str>| l.map_or("<end of file>".to_string(), str::to_string);
            return (n, show(c), show(g));
        }
    }
    unreachable!("the contents differ, so some line does")
}

#[test]
fn committed_crds_match_the_types() {
    let generated = nereid_crds::crd_yaml();
    let mut stale = Vec::new();
    for relative in COMMITTED {
        let path = workspace_root().join(relative);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != generated {
            let (line, was, now) = first_difference(&committed, &generated);
            stale.push(format!(
                "  {relative}: line {line}\n    committed: {was}\n    generated: {now}"
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "the committed CRD YAML differs from the Rust types:\n{}\n\nRegenerate from the workspace root:\n{}\n",
        stale.join("\n"),
        COMMITTED
            .map(|p| format!("  cargo run -q -p nereid-crds --bin crds > {p}"))
            .join("\n")
    );
}
