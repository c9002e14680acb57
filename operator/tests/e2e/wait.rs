//! Waiting for the cluster to get somewhere, without sleeping blindly.

use std::future::Future;
use std::time::Duration;

use anyhow::{Result, anyhow};
use tokio::time::Instant;

/// How often a condition is checked.
const POLL: Duration = Duration::from_millis(250);
/// The usual bound: controllers and KWOK act within seconds; a minute only
/// matters on a loaded machine, and a failing test still ends in bounded time.
pub const LONG: Duration = Duration::from_secs(90);

/// Checks `check` until it returns `Ok`, for at most `timeout`. An `Err` means
/// "not yet" and says what was seen; the last one is in the timeout error.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return Ok(value),
            Err(last) if Instant::now() >= deadline => {
                return Err(anyhow!("{what}: not within {timeout:?}; last seen: {last:#}"));
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}
