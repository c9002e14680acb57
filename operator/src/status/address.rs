//! Where a model is called: its own Service (`status.endpoints`), and the
//! infer URL a user copies (`status.url`, `status.address.url`), which goes
//! through nereid-gateway when the operator is told of one that routes the
//! model's namespace, since the gateway balances each request while the
//! Service balances connections only.

use nereid_crds::Endpoints;

use crate::builders::service::Ports;
use crate::context::{Gateway, OperatorConfig};

/// A model's addresses.
#[derive(Clone, Debug, PartialEq)]
pub struct Addresses {
    /// The model's Service, always.
    pub service: Endpoints,
    /// The KServe v2 infer URL to call.
    pub url: String,
}

/// The addresses of the model `name` in `namespace` whose Service has `ports`.
pub fn of_model(name: &str, namespace: &str, ports: &Ports, config: &OperatorConfig) -> Addresses {
    let host = format!("{name}.{namespace}.svc.{}", config.cluster_domain);
    let service = Endpoints {
        grpc: format!("{host}:{}", ports.grpc),
        http: format!("http://{host}:{}", ports.http),
    };
    let url = match &config.gateway {
        Some(gateway) if gateway.routes(namespace) => gateway_url(gateway, namespace, name),
        _ => format!("{}/v2/models/{name}/infer", service.http),
    };
    Addresses { service, url }
}

/// The gateway's infer URL for a model. Always namespace-qualified
/// (`<namespace>%2F<name>`, the gateway's spelling in a path): a plain name
/// would stop working the day another namespace holds the same name.
fn gateway_url(gateway: &Gateway, namespace: &str, name: &str) -> String {
    format!(
        "{}/v2/models/{namespace}%2F{name}/infer",
        gateway.http.trim_end_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORTS: Ports = Ports {
        http: 8000,
        grpc: 8001,
        metrics: 8002,
    };

    #[test]
    fn without_a_gateway_the_url_is_the_services() {
        let a = of_model("mlp", "ml", &PORTS, &OperatorConfig::default());
        assert_eq!(a.service.http, "http://mlp.ml.svc.cluster.local:8000");
        assert_eq!(a.service.grpc, "mlp.ml.svc.cluster.local:8001");
        assert_eq!(a.url, "http://mlp.ml.svc.cluster.local:8000/v2/models/mlp/infer");
    }

    #[test]
    fn a_gateway_that_routes_the_namespace_gives_the_url() {
        let config = OperatorConfig {
            gateway: Some(Gateway {
                http: "http://gw.nereid.svc.cluster.local:8000/".into(),
                grpc: "gw.nereid.svc.cluster.local:8001".into(),
                namespaces: Some(vec!["ml".into()]),
            }),
            ..OperatorConfig::default()
        };
        let a = of_model("mlp", "ml", &PORTS, &config);
        assert_eq!(
            a.url,
            "http://gw.nereid.svc.cluster.local:8000/v2/models/ml%2Fmlp/infer"
        );
        assert_eq!(
            a.service.http, "http://mlp.ml.svc.cluster.local:8000",
            "the Service stays"
        );
        let elsewhere = of_model("mlp", "team", &PORTS, &config);
        assert_eq!(
            elsewhere.url,
            "http://mlp.team.svc.cluster.local:8000/v2/models/mlp/infer"
        );
    }
}
