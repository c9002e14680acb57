//! Leader election through a `coordination.k8s.io/v1` Lease, so several
//! operator replicas can run and exactly one reconciles.
//!
//! The leader renews the lease every third of its duration. Another replica
//! takes it over only once it has not been renewed for a whole duration.
//! Every write carries the lease's `resourceVersion`, so when two replicas
//! race, the API server lets exactly one of them win (the other gets 409
//! Conflict and keeps waiting). Whether to create, renew, take over or wait
//! is the pure [`decide`], tested on its own.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No lease yet: create it, holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Its holder stopped renewing (or released it): take it.
    TakeOver,
    /// Someone else holds it.
    Wait,
}

/// What to do with the lease as it stands at `now`.
pub fn decide(lease: Option<&LeaseSpec>, me: &str, now: Timestamp, duration: Duration) -> Decision {
    let Some(spec) = lease else {
        return Decision::Create;
    };
    match spec.holder_identity.as_deref() {
        Some(holder) if holder == me => Decision::Renew,
        None | Some("") => Decision::TakeOver,
        Some(_) => {
            let lease_duration = spec
                .lease_duration_seconds
                .map_or(duration, |s| Duration::from_secs(u64::try_from(s).unwrap_or(0)));
            let renewed = spec.renew_time.as_ref().map(|t| t.0);
            let expired = renewed.is_none_or(|at| {
                let elapsed = now.duration_since(at);
                elapsed.as_secs_f64() >= lease_duration.as_secs_f64()
            });
            if expired { Decision::TakeOver } else { Decision::Wait }
        }
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, duration: Duration) -> Self {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
        }
    }

    /// One round: returns whether we hold the lease afterwards.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let now = Timestamp::now();
        let decision = decide(
            current.as_ref().and_then(|l| l.spec.as_ref()),
            &self.identity,
            now,
            self.duration,
        );
        let holding = |previous: Option<&LeaseSpec>, transition: bool| LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX)),
            acquire_time: if transition {
                Some(MicroTime(now))
            } else {
                previous.and_then(|p| p.acquire_time.clone())
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(
                previous.and_then(|p| p.lease_transitions).unwrap_or(0) + i32::from(transition && previous.is_some()),
            ),
            ..Default::default()
        };
        let result = match decision {
            Decision::Wait => return Ok(false),
            Decision::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(holding(None, true)),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Decision::Renew | Decision::TakeOver => {
                let mut lease = current.expect("renew and take-over follow an existing lease");
                let previous = lease.spec.take();
                lease.spec = Some(holding(previous.as_ref(), decision == Decision::TakeOver));
                // `lease.metadata.resource_version` is kept: a racing writer gets 409.
                self.api.replace(&self.name, &PostParams::default(), &lease).await
            }
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up at shutdown so another replica need not wait it out.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
            return;
        };
        let ours = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .is_some_and(|h| h == self.identity);
        if ours {
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
                spec.renew_time = None;
            }
            if let Err(e) = self.api.replace(&self.name, &PostParams::default(), &lease).await {
                tracing::warn!(error = %e, "could not release the leader lease");
            }
        }
    }

    /// Keeps trying and renewing until `stop`; publishes whether we lead.
    pub async fn run(self, leading: watch::Sender<bool>, stop: CancellationToken) {
        let period = self.duration / 3;
        loop {
            let holds = match self.try_acquire().await {
                Ok(holds) => holds,
                Err(e) => {
                    tracing::warn!(error = %e, "leader election round failed");
                    false
                }
            };
            if *leading.borrow() != holds {
                tracing::info!(identity = %self.identity, leading = holds, "leadership changed");
            }
            leading.send_replace(holds);
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(period) => {}
            }
        }
        if *leading.borrow() {
            self.release().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed_secs_ago: Option<i64>, now: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: renewed_secs_ago.map(|s| {
                MicroTime(
                    now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                        .unwrap(),
                )
            }),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::now();
        let d = Duration::from_secs(15);
        assert_eq!(decide(None, "a", now, d), Decision::Create);
        assert_eq!(
            decide(Some(&lease(Some("a"), Some(3), now)), "a", now, d),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&lease(Some("b"), Some(3), now)), "a", now, d),
            Decision::Wait
        );
        assert_eq!(
            decide(Some(&lease(Some("b"), Some(16), now)), "a", now, d),
            Decision::TakeOver
        );
        assert_eq!(decide(Some(&lease(None, None, now)), "a", now, d), Decision::TakeOver);
        assert_eq!(
            decide(Some(&lease(Some("b"), None, now)), "a", now, d),
            Decision::TakeOver
        );
    }
}
