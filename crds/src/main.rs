//! `crds`: prints the CRD YAML of Nereid's custom resources to stdout.
//!
//! `cargo run -p nereid-crds --bin crds > charts/nereid/crds/nereid-crds.yaml`

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    match std::io::stdout().write_all(nereid_crds::crd_yaml().as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`crds | head`) is the reader's choice, not a failure.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crds: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}
