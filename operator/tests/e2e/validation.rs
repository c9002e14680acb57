//! The CRDs' CEL rules (and the API server's own checks) reject the invalid
//! examples at apply time, each with the one message its header promises,
//! and nothing is stored.

use anyhow::{Context, Result, ensure};

use crate::env::Env;

const NAMESPACE: &str = "default";
/// The header line that says what `kubectl apply` answers.
const PROMISE: &str = "# kubectl apply answers: ";

pub async fn run(env: &Env) -> Result<()> {
    let dir = env.path("deploy/examples/invalid");
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    ensure!(files.len() >= 4, "only {} invalid examples", files.len());
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let promised = text
            .lines()
            .find_map(|l| l.strip_prefix(PROMISE))
            .with_context(|| format!("{} has no '{PROMISE}' line", file.display()))?;
        // The header may elide the rest of the message with "...".
        let promised = promised.trim_end_matches("...").trim();
        let output = env
            .kubectl_output(
                ["apply", "-n", NAMESPACE, "-f", file.to_str().unwrap_or_default()],
                None,
            )
            .await?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        ensure!(!output.status.success(), "{} was accepted", file.display());
        ensure!(
            stderr.contains(promised),
            "{}: expected {promised:?} in kubectl's answer, got: {stderr}",
            file.display()
        );
        // One broken rule, one error: kubectl lists several as "* " lines.
        ensure!(
            !stderr.contains("\n* "),
            "{}: more than one error for one broken rule: {stderr}",
            file.display()
        );
    }
    let stored = env
        .kubectl(["get", "-n", NAMESPACE, "inferencemodels,modelensembles", "-o", "name"])
        .await?;
    ensure!(stored.trim().is_empty(), "invalid objects were stored: {stored}");
    Ok(())
}
