//! `nereid`: the four programs in one binary, as BusyBox does it.
//!
//! The image links `nereid-server`, `nereid-fetch`, `nereid-operator` and
//! `nereid-gateway` to this one file, and the name a program is run by picks
//! it, so the chart's `command: ["nereid-operator"]` and the operator's init
//! container's `nereid-fetch` work unchanged. `nereid server ...` (the name
//! without its prefix, first) does the same from any name.
//!
//! Why: the four share most of their code (tokio, hyper, tonic, rustls with
//! aws-lc, object storage, kube), and one copy of it is what kept the CPU
//! image under its 150 MB bound (scripts/image.sh measures it).

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

/// A program's entry point, given the arguments with the program's name first.
type Entry = fn(Vec<OsString>) -> ExitCode;

/// Each program, by name.
const PROGRAMS: &[(&str, Entry)] = &[
    ("nereid-server", |args| nereid_server::command::main(args)),
    ("nereid-fetch", |args| nereid_server::command::fetch::main(args)),
    ("nereid-operator", |args| nereid_operator::command::main(args)),
    ("nereid-gateway", |args| nereid_gateway::command::main(args)),
];

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let called = args
        .first()
        .and_then(|path| Path::new(path).file_name())
        .and_then(|name| name.to_str())
        .unwrap_or_default();
    if let Some((_, run)) = PROGRAMS.iter().find(|(name, _)| *name == called) {
        return run(args);
    }
    // `nereid server ARGS...`: the program named by the first argument, run
    // as if by its own name.
    let chosen = args.get(1).and_then(|first| first.to_str()).and_then(|first| {
        PROGRAMS
            .iter()
            .find(|(name, _)| name.strip_prefix("nereid-") == Some(first))
    });
    match chosen {
        Some((name, run)) => {
            let mut args = args;
            args.splice(0..2, [OsString::from(name)]);
            run(args)
        }
        None => {
            let names: Vec<&str> = PROGRAMS.iter().map(|(name, _)| *name).collect();
            eprintln!(
                "Usage: nereid PROGRAM [ARGS...], or run this binary by a program's name\n\
                 Programs: {} (PROGRAM is the name without 'nereid-')",
                names.join(", ")
            );
            ExitCode::from(2)
        }
    }
}
