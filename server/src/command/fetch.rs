//! `nereid-fetch URI DEST`: copies one model folder from object storage
//! (`s3://bucket/repo/model`, `gs://...`, `as://account/container/...`) to a
//! local folder, with the same code and the same credentials from the
//! environment as `nereid-server --model-repository`.
//!
//! The Kubernetes operator runs it in a serving pod's init container, so the
//! model lands under the InferenceModel's own name whatever its folder in
//! the bucket is called.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use nereid_object_storage::RemoteRoot;

const USAGE: &str = "Usage: nereid-fetch URI DEST

Copies the model folder URI from object storage to the folder DEST.
URI: s3://bucket/path/model, gs://bucket/path/model, as://account/container/path/model.
Credentials come from the environment, as for nereid-server --model-repository.";

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
    let [uri, destination] = args.as_slice() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("nereid-fetch: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(fetch(uri, PathBuf::from(destination))) {
        Ok(()) => {
            eprintln!("nereid-fetch: copied {uri} to {destination}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nereid-fetch: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn fetch(uri: &str, destination: PathBuf) -> Result<(), crate::error::Error> {
    let trimmed = uri.trim_end_matches('/');
    let (repository, model) = trimmed
        .rsplit_once('/')
        .filter(|(repository, model)| !model.is_empty() && repository.contains("://"))
        .ok_or_else(|| crate::error::Error::invalid(format!("'{uri}' does not name a model folder")))?;
    let cache = destination
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let root = RemoteRoot::parse(repository, cache)?;
    root.fetch_to(model, &destination).await
}
