//! `pb_utils.Logger`: a model's log lines, in the server's log, at their
//! level and with the model's name.

/// Logs one line a stub sent.
pub fn emit(model: &str, level: &str, message: &str, file: Option<&str>, line: Option<u64>) {
    let file = file.unwrap_or("");
    let line = line.unwrap_or(0);
    match level {
        "ERROR" => tracing::error!(model, file, line, "{message}"),
        "WARNING" | "WARN" => tracing::warn!(model, file, line, "{message}"),
        "VERBOSE" => tracing::debug!(model, file, line, "{message}"),
        _ => tracing::info!(model, file, line, "{message}"),
    }
}
