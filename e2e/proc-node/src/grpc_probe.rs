//! The kubelet's gRPC probe: `grpc.health.v1.Health/Check` over plaintext
//! HTTP/2 on the pod's IP, with the health client the workspace's protocol
//! crate generates; SERVING is a success, anything else says what it was.

use std::net::Ipv4Addr;
use std::time::Duration;

use nereid_proto::health::v1::HealthCheckRequest;
use nereid_proto::health::v1::health_check_response::ServingStatus;
use nereid_proto::health::v1::health_client::HealthClient;

/// One check of `service` ("" for the server as a whole) at `ip:port`.
pub async fn check(ip: Ipv4Addr, port: u16, service: &str, limit: Duration) -> Result<(), String> {
    let target = format!("{ip}:{port}");
    let call = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{target}"))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("failed to connect service \"{target}\": {e}"))?;
        let request = HealthCheckRequest {
            service: service.to_string(),
        };
        let response = HealthClient::new(channel)
            .check(request)
            .await
            .map_err(|status| format!("rpc error: code = {:?} desc = {}", status.code(), status.message()))?;
        match response.into_inner().status() {
            ServingStatus::Serving => Ok(()),
            other => Err(format!(
                "service unhealthy (responded with \"{}\")",
                other.as_str_name()
            )),
        }
    };
    match tokio::time::timeout(limit, call).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!(
            "timeout: health rpc did not complete within {}s",
            limit.as_secs()
        )),
    }
}
