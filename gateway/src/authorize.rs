//! Whether a request may reach the model it names: the one check both
//! fronts make, once the name is known (from an HTTP path, or a gRPC
//! call's first message) and before the body is read further or anything
//! is forwarded.
//!
//! The namespace checked is the one the name leads to
//! ([`Registry::destination`]): the one a `namespace/name` (or the
//! `nereid-namespace` header) names, checked before looking for the model
//! so that a client without its token learns nothing of what the namespace
//! holds; or, for a plain name, the namespace resolution picks. A request is
//! then routed by `namespace/name`, so that no change to the registry
//! between this check and the pick sends it to another namespace.
//!
//! A plain name never says more to a client than it may see:
//!
//! - one that leads to a namespace the request is not authorized for is
//!   refused without naming that namespace, and so is an ambiguous one
//!   that any namespace it may not see holds (naming the candidates would
//!   list them);
//! - an ambiguous name whose namespaces the request may all reach gets the
//!   usual error, which lists them;
//! - a name no namespace holds is unknown, as before.
//!
//! What is left to tell: that a plain name is held by some namespace the
//! client may not reach (refused, not unknown). A wrong token and no token
//! read the same.

use thiserror::Error;

use crate::registry::{Destination, Registry, RouteError};

/// Why a request may not reach the model it names. The words are the same
/// whether the request carried no token or a wrong one.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Unauthorized {
    #[error(
        "not authorized for model {model:?}: namespace {namespace:?} takes only requests that carry \
         \"authorization: Bearer <token>\" with a token it accepts"
    )]
    Namespace { model: String, namespace: String },
    #[error(
        "not authorized for model {name:?}: a namespace this request is not authorized for holds that name; \
         name the model as \"<namespace>/{name}\" and send \"authorization: Bearer <token>\" with a token \
         that namespace accepts"
    )]
    PlainName { name: String },
}

/// A request the gateway answers itself, before forwarding it.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Refused {
    #[error(transparent)]
    Unauthorized(#[from] Unauthorized),
    /// A plain name that is unknown or ambiguous: answered here, so that no
    /// plain name is ever routed unchecked.
    #[error(transparent)]
    Route(#[from] RouteError),
}

/// The name to route `requested` by, `namespace/name`, if the namespaces
/// `allowed` accepts let the request reach it.
pub fn admit(registry: &Registry, requested: String, allowed: impl Fn(&str) -> bool) -> Result<String, Refused> {
    // Owned, so that `requested` is no longer borrowed below.
    let leads = match registry.destination(&requested) {
        Destination::Named { namespace } if allowed(namespace) => Leads::To(None),
        Destination::Named { namespace } => Leads::ClosedNamespace(namespace.to_string()),
        Destination::Resolved(key) if allowed(&key.namespace) => Leads::To(Some(key.to_string())),
        Destination::Ambiguous(namespaces) if namespaces.iter().all(|namespace| allowed(namespace)) => {
            Leads::Ambiguous(namespaces.into_iter().map(str::to_string).collect())
        }
        Destination::Resolved(_) | Destination::Ambiguous(_) => Leads::ClosedPlainName,
        Destination::Unknown => Leads::Unknown,
    };
    match leads {
        Leads::To(routed) => Ok(routed.unwrap_or(requested)),
        Leads::ClosedNamespace(namespace) => Err(Unauthorized::Namespace {
            model: requested,
            namespace,
        }
        .into()),
        Leads::ClosedPlainName => Err(Unauthorized::PlainName { name: requested }.into()),
        Leads::Ambiguous(namespaces) => Err(RouteError::Ambiguous {
            name: requested,
            namespaces,
        }
        .into()),
        Leads::Unknown => Err(RouteError::Unknown(requested).into()),
    }
}

/// What [`admit`] found a name leads to.
enum Leads {
    /// Route by this name (`None`: the name as requested).
    To(Option<String>),
    /// A named namespace the request may not reach.
    ClosedNamespace(String),
    /// A plain name held by a namespace the request may not reach.
    ClosedPlainName,
    /// A plain name held by these namespaces, which the request may reach.
    Ambiguous(Vec<String>),
    Unknown,
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::registry::{Address, ModelKey};

    fn key(namespace: &str, name: &str) -> ModelKey {
        ModelKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// `resnet` in ml (protected) and team (open); `bert` in ml only, with
    /// no ready pod; `gpt` in team only.
    fn registry(default: Option<&str>) -> Registry {
        let address = Address {
            http: SocketAddr::from(([10, 0, 0, 1], 8000)),
            grpc: SocketAddr::from(([10, 0, 0, 1], 8001)),
        };
        let mut registry = Registry::new(default.map(str::to_string));
        registry.set_endpoints(key("ml", "resnet"), &[address], 1);
        registry.set_endpoints(key("team", "resnet"), &[address], 1);
        registry.set_endpoints(key("ml", "bert"), &[], 1);
        registry.set_endpoints(key("team", "gpt"), &[address], 1);
        registry
    }

    fn outsider(namespace: &str) -> bool {
        namespace != "ml"
    }

    fn insider(_: &str) -> bool {
        true
    }

    #[test]
    fn a_named_namespace_is_checked_before_its_models_are_looked_for() {
        let registry = registry(None);
        assert_eq!(admit(&registry, "ml/resnet".into(), insider), Ok("ml/resnet".into()));
        let held = admit(&registry, "ml/resnet".into(), outsider).unwrap_err();
        let missing = admit(&registry, "ml/nothing".into(), outsider).unwrap_err();
        assert_eq!(
            held,
            Refused::Unauthorized(Unauthorized::Namespace {
                model: "ml/resnet".into(),
                namespace: "ml".into()
            })
        );
        assert!(matches!(missing, Refused::Unauthorized(Unauthorized::Namespace { .. })));
        // An open namespace's unknown model is routed, to be found unknown.
        assert_eq!(
            admit(&registry, "team/nothing".into(), outsider),
            Ok("team/nothing".into())
        );
    }

    #[test]
    fn a_plain_name_is_checked_against_the_namespace_it_resolves_to_and_pinned_there() {
        let registry = registry(None);
        assert_eq!(admit(&registry, "gpt".into(), outsider), Ok("team/gpt".into()));
        assert_eq!(admit(&registry, "bert".into(), insider), Ok("ml/bert".into()));
        let refused = admit(&registry, "bert".into(), outsider).unwrap_err();
        assert_eq!(
            refused,
            Refused::Unauthorized(Unauthorized::PlainName { name: "bert".into() })
        );
        assert!(
            !refused.to_string().contains("ml/") && !refused.to_string().contains("\"ml\""),
            "{refused}"
        );

        // With a default namespace, the default's model is the one checked.
        let with_default = self::registry(Some("ml"));
        assert_eq!(admit(&with_default, "resnet".into(), insider), Ok("ml/resnet".into()));
        assert!(matches!(
            admit(&with_default, "resnet".into(), outsider),
            Err(Refused::Unauthorized(Unauthorized::PlainName { .. }))
        ));
        let open_default = self::registry(Some("team"));
        assert_eq!(
            admit(&open_default, "resnet".into(), outsider),
            Ok("team/resnet".into())
        );
    }

    #[test]
    fn an_ambiguous_name_lists_its_namespaces_only_to_whom_may_reach_them_all() {
        let registry = registry(None);
        assert_eq!(
            admit(&registry, "resnet".into(), insider),
            Err(Refused::Route(RouteError::Ambiguous {
                name: "resnet".into(),
                namespaces: vec!["ml".into(), "team".into()],
            }))
        );
        let refused = admit(&registry, "resnet".into(), outsider).unwrap_err();
        // The same words as a name only ml holds: nothing tells the two apart.
        assert_eq!(
            refused.to_string(),
            admit(&registry, "bert".into(), outsider)
                .unwrap_err()
                .to_string()
                .replace("bert", "resnet")
        );
        assert!(!refused.to_string().contains("\"ml\""), "{refused}");
        assert_eq!(
            admit(&registry, "nothing".into(), outsider),
            Err(Refused::Route(RouteError::Unknown("nothing".into())))
        );
    }
}
