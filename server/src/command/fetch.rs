//! `nereid-fetch`: puts a model folder where a serving pod's server reads
//! it, with no shell.
//!
//! The Kubernetes operator runs it in a serving pod's init containers, so
//! the model lands under the InferenceModel's own name whatever its folder
//! at the source is called. The image has no shell (`FROM scratch`), so
//! each step an init container takes is one of these forms:
//!
//! - `nereid-fetch URI DEST`: copies one model folder from object storage
//!   (`s3://bucket/repo/model`, `gs://...`, `as://account/container/...`)
//!   to DEST, with the same code and the same credentials from the
//!   environment as `nereid-server --model-repository`;
//! - `nereid-fetch pvc://claim/path DEST --from DIR`: copies the folder the
//!   claim's path is mounted at (DIR) to DEST;
//! - `nereid-fetch --write-configs DIR MODELS`: for each `NAME.pbtxt` in
//!   DIR (the operator's ConfigMap), writes `MODELS/NAME/config.pbtxt` and
//!   an empty version folder `MODELS/NAME/1` (what an ensemble needs).
//!
//! Any other URI is refused with the sources it supports, so the pod shows
//! the failure instead of serving an empty folder.
//!
//! With `--progress-port PORT`, a fetch from object storage serves how far
//! it is (`GET /progress`: bytes in all and fetched, as JSON;
//! [`nereid_proto::contract::fetch_progress`]) on that port of every
//! address while it runs: the operator reads it into the InferenceModel's
//! status while a large model downloads.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use nereid_object_storage::{FetchProgress, RemoteRoot};
use nereid_proto::contract::fetch_progress;

use crate::error::Error;
use crate::transport::{self, Acceptor, ConnectionLimits, ServeOptions};

const USAGE: &str = "Usage: nereid-fetch URI DEST [--from DIR] [--progress-port PORT]
       nereid-fetch --write-configs DIR MODELS

The first form copies the model folder URI to the folder DEST.
URI: s3://bucket/path/model, gs://bucket/path/model, as://account/container/path/model
     (credentials from the environment, as for nereid-server --model-repository),
     or pvc://claim/path with --from naming the folder the claim's path is mounted at.
--progress-port serves a fetch's progress as JSON at http://*:PORT/progress while it runs.
The second writes MODELS/NAME/config.pbtxt and MODELS/NAME/1 for each NAME.pbtxt in DIR.";

/// The largest number of entries `--from` copies: a claim's folder is the
/// user's, and a copy that never ends would hold the pod in its init step.
const MAX_COPIED_ENTRIES: usize = 100_000;

/// What one run does.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Fetch {
        uri: String,
        destination: PathBuf,
        progress_port: Option<u16>,
    },
    Copy {
        uri: String,
        from: PathBuf,
        destination: PathBuf,
    },
    WriteConfigs {
        configs: PathBuf,
        models: PathBuf,
    },
}

fn parse(args: &[String]) -> Option<Step> {
    if let [flag, configs, models] = args
        && flag == "--write-configs"
    {
        return Some(Step::WriteConfigs {
            configs: configs.into(),
            models: models.into(),
        });
    }
    let [uri, destination, options @ ..] = args else {
        return None;
    };
    if uri.starts_with('-') || destination.starts_with('-') {
        return None;
    }
    let (mut from, mut progress_port) = (None, None);
    for pair in options.chunks(2) {
        match pair {
            [flag, dir] if flag == "--from" && from.is_none() => from = Some(PathBuf::from(dir)),
            [flag, port] if flag == fetch_progress::FLAG && progress_port.is_none() => {
                progress_port = Some(port.parse::<u16>().ok()?)
            }
            _ => return None,
        }
    }
    Some(match from {
        // A claim's copy is local and quick: it reports no progress.
        Some(from) if progress_port.is_none() => Step::Copy {
            uri: uri.clone(),
            from,
            destination: destination.into(),
        },
        Some(_) => return None,
        None => Step::Fetch {
            uri: uri.clone(),
            destination: destination.into(),
            progress_port,
        },
    })
}

/// Runs `nereid-fetch` with these command-line arguments (the program's name
/// first).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: Vec<String> = args
        .into_iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if matches!(args.as_slice(), [flag] if flag == "--help" || flag == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let Some(step) = parse(&args) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    match run(&step) {
        Ok(done) => {
            eprintln!("nereid-fetch: {done}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nereid-fetch: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Takes the step; what it did, in a line.
fn run(step: &Step) -> Result<String, Error> {
    match step {
        Step::Fetch {
            uri,
            destination,
            progress_port,
        } => {
            if uri.starts_with("pvc://") {
                return Err(Error::invalid(format!(
                    "'{uri}' is a claim: name the folder it is mounted at with --from"
                )));
            }
            supported(uri)?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::internal(format!("cannot start: {e}")))?;
            let progress = Arc::new(FetchProgress::new());
            runtime.block_on(async {
                if let Some(port) = progress_port {
                    serve_progress(*port, Arc::clone(&progress)).await;
                }
                fetch(uri, destination.clone(), progress).await
            })?;
            Ok(format!("copied {uri} to {}", destination.display()))
        }
        Step::Copy { uri, from, destination } => {
            if !uri.starts_with("pvc://") {
                supported(uri)?;
                return Err(Error::invalid(format!("--from is for pvc:// sources, not '{uri}'")));
            }
            let mut budget = MAX_COPIED_ENTRIES;
            copy_tree(from, destination, &mut budget)?;
            Ok(format!(
                "copied {uri} (mounted at {}) to {}",
                from.display(),
                destination.display()
            ))
        }
        Step::WriteConfigs { configs, models } => {
            let written = write_configs(configs, models)?;
            Ok(format!(
                "wrote the configs of {} model(s) into {}",
                written.len(),
                models.display()
            ))
        }
    }
}

/// Refuses a source this program cannot read, naming those it can.
fn supported(uri: &str) -> Result<(), Error> {
    const SCHEMES: [&str; 5] = ["s3://", "gs://", "as://", "az://", "pvc://"];
    if SCHEMES.iter().any(|s| uri.starts_with(s)) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "cannot fetch {uri}: supported sources are s3://, gs://, as:// and pvc://"
        )))
    }
}

/// Connections the progress endpoint holds at once (the operator asks
/// one at a time); one more is closed at once.
const PROGRESS_CONNECTIONS: usize = 16;
/// How long a connection may take to send its request head, and to start.
const PROGRESS_CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `progress` on `port` of every address until the runtime ends
/// (with the fetch), through the server's own acceptor and loop: its
/// connection cap, handshake deadline and header read timeout. A port that
/// cannot be bound costs the report, not the fetch: the log says so and the
/// fetch goes on.
async fn serve_progress(port: u16, progress: Arc<FetchProgress>) {
    let listener = match tokio::net::TcpListener::bind(("0.0.0.0", port)).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("nereid-fetch: cannot serve progress on port {port}: {e}; fetching without it");
            return;
        }
    };
    let app = axum::Router::new().route(
        fetch_progress::PATH,
        axum::routing::get(move || {
            let (done, total) = progress.snapshot();
            async move {
                axum::Json(serde_json::json!({
                    fetch_progress::BYTES_TOTAL: total,
                    fetch_progress::BYTES_DONE: done,
                }))
            }
        }),
    );
    let limits = ConnectionLimits {
        max_connections: PROGRESS_CONNECTIONS,
        handshake_timeout: PROGRESS_CLIENT_TIMEOUT,
    };
    let options = ServeOptions {
        http1_header_timeout: Some(PROGRESS_CLIENT_TIMEOUT),
        max_concurrent_streams: 4,
        keepalive: Duration::from_secs(60),
        keepalive_timeout: PROGRESS_CLIENT_TIMEOUT,
        http2_idle_timeout: Duration::from_secs(60),
        first_request_timeout: PROGRESS_CLIENT_TIMEOUT,
        http2_date_header: true,
    };
    tokio::spawn(transport::serve(
        Acceptor::new("progress", listener, limits, None),
        hyper_util::service::TowerToHyperService::new(app),
        options,
        std::future::pending(),
    ));
}

async fn fetch(uri: &str, destination: PathBuf, progress: Arc<FetchProgress>) -> Result<(), Error> {
    let trimmed = uri.trim_end_matches('/');
    let (repository, model) = trimmed
        .rsplit_once('/')
        .filter(|(repository, model)| !model.is_empty() && repository.contains("://"))
        .ok_or_else(|| Error::invalid(format!("'{uri}' does not name a model folder")))?;
    let cache = destination
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let root = RemoteRoot::parse(repository, cache)?;
    root.fetch_reporting(model, &destination, Some(progress)).await
}

/// Copies the folder `from` into `to` (created), files and folders; a
/// symbolic link is copied as what it points to, as `cp -R` of a mounted
/// claim's contents would.
fn copy_tree(from: &Path, to: &Path, budget: &mut usize) -> Result<(), Error> {
    std::fs::create_dir_all(to).map_err(|e| failed("create", to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| failed("read", from, e))? {
        let entry = entry.map_err(|e| failed("read", from, e))?;
        *budget = budget.checked_sub(1).ok_or_else(|| {
            Error::invalid(format!(
                "'{}' holds more than {MAX_COPIED_ENTRIES} files and folders",
                from.display()
            ))
        })?;
        let source = entry.path();
        let target = to.join(entry.file_name());
        let metadata = std::fs::metadata(&source).map_err(|e| failed("read", &source, e))?;
        if metadata.is_dir() {
            copy_tree(&source, &target, budget)?;
        } else {
            std::fs::copy(&source, &target).map_err(|e| failed("copy", &source, e))?;
        }
    }
    Ok(())
}

/// Writes each `NAME.pbtxt` of `configs` as `models/NAME/config.pbtxt`,
/// with a version folder `1`; returns the names, sorted.
fn write_configs(configs: &Path, models: &Path) -> Result<Vec<String>, Error> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(configs).map_err(|e| failed("read", configs, e))? {
        let path = entry.map_err(|e| failed("read", configs, e))?.path();
        // A ConfigMap's mount also holds `..data` and dated folders: only
        // the keys' own names count.
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".pbtxt"))
            .filter(|n| !n.is_empty() && !n.starts_with('.'))
        else {
            continue;
        };
        let folder = models.join(name);
        std::fs::create_dir_all(folder.join("1")).map_err(|e| failed("create", &folder, e))?;
        std::fs::copy(&path, folder.join("config.pbtxt")).map_err(|e| failed("copy", &path, e))?;
        eprintln!("model-configs: wrote {}", folder.display());
        names.push(name.to_string());
    }
    names.sort();
    Ok(names)
}

/// A file system call on `path` that failed.
fn failed(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::internal(format!("cannot {what} '{}': {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn parses_the_three_forms_and_nothing_else() {
        assert_eq!(
            parse(&strings(&["s3://b/r/m", "/models/m"])),
            Some(Step::Fetch {
                uri: "s3://b/r/m".into(),
                destination: "/models/m".into(),
                progress_port: None,
            })
        );
        assert_eq!(
            parse(&strings(&["s3://b/r/m", "/models/m", "--progress-port", "8009"])),
            Some(Step::Fetch {
                uri: "s3://b/r/m".into(),
                destination: "/models/m".into(),
                progress_port: Some(8009),
            })
        );
        assert!(matches!(
            parse(&strings(&["pvc://c/p", "/models/m", "--from", "/source"])),
            Some(Step::Copy { .. })
        ));
        assert!(matches!(
            parse(&strings(&["--write-configs", "/etc/nereid/config", "/models"])),
            Some(Step::WriteConfigs { .. })
        ));
        for bad in [
            &[][..],
            &["one"][..],
            &["--from", "x"][..],
            &["a", "b", "--to", "c"][..],
            &["a", "b", "--progress-port", "99999"][..],
            &["a", "b", "--from", "x", "--from", "y"][..],
            &["pvc://c/p", "b", "--from", "x", "--progress-port", "1"][..],
        ] {
            assert_eq!(parse(&strings(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn refuses_what_it_cannot_fetch() {
        let run_on = |uri: &str| {
            run(&Step::Fetch {
                uri: uri.into(),
                destination: "/nonexistent".into(),
                progress_port: None,
            })
            .unwrap_err()
            .to_string()
        };
        assert!(
            run_on("https://example.com/m.tar.gz").contains("supported sources are s3://, gs://, as:// and pvc://")
        );
        assert!(run_on("pvc://claim/path").contains("with --from"));
    }

    #[test]
    fn copies_a_claims_folder_and_writes_configs() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("source");
        std::fs::create_dir_all(source.join("1")).unwrap();
        std::fs::write(source.join("config.pbtxt"), "name: \"m\"").unwrap();
        std::fs::write(source.join("1/model.onnx"), "onnx").unwrap();
        let models = dir.path().join("models");
        let done = run(&Step::Copy {
            uri: "pvc://claim/m".into(),
            from: source,
            destination: models.join("m"),
        })
        .unwrap();
        assert!(done.contains("copied pvc://claim/m"), "{done}");
        assert_eq!(std::fs::read_to_string(models.join("m/1/model.onnx")).unwrap(), "onnx");

        let configs = dir.path().join("configs");
        std::fs::create_dir_all(configs.join("..2026_12_07")).unwrap();
        std::fs::write(configs.join("a.pbtxt"), "name: \"a\"").unwrap();
        std::fs::write(configs.join("b.pbtxt"), "name: \"b\"").unwrap();
        std::fs::write(configs.join("config.json"), "{}").unwrap();
        assert_eq!(write_configs(&configs, &models).unwrap(), vec!["a", "b"]);
        assert_eq!(
            std::fs::read_to_string(models.join("b/config.pbtxt")).unwrap(),
            "name: \"b\""
        );
        assert!(models.join("a/1").is_dir());
    }
}
