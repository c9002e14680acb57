//! Pod IPs: a private range made local on the loopback device.
//!
//! `ip route add local 10.244.0.0/16 dev lo` makes every address of the
//! range bindable and reachable on this host, so each pod gets its own IP
//! (the API server refuses loopback addresses in EndpointSlices, so 127.x
//! will not do) and several pods can listen on one port. Node `i` hands
//! out `10.244.i.2` to `10.244.i.254`; `10.244.i.1` is the node's own.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};

#[derive(Clone)]
pub struct PodNetwork(Arc<Inner>);

struct Inner {
    cidr: String,
    base: [u8; 2],
    /// Pod UID to its IP, per node.
    leases: Mutex<Vec<HashMap<String, Ipv4Addr>>>,
}

impl PodNetwork {
    /// Makes `cidr` (a /16) local on lo, replacing a stale route a killed
    /// run left behind.
    pub fn claim(cidr: &str, nodes: usize) -> Result<Self> {
        let (addr, prefix) = cidr.split_once('/').context("--cidr needs a prefix length")?;
        if prefix != "16" {
            bail!("--cidr must be a /16, got {cidr}");
        }
        let addr: Ipv4Addr = addr.parse().context("--cidr address")?;
        if nodes > 250 {
            bail!("at most 250 nodes");
        }
        let _ = ip(&["route", "del", "local", cidr, "dev", "lo"]);
        ip(&["route", "add", "local", cidr, "dev", "lo"])
            .context("making the pod range local on lo (needs NET_ADMIN)")?;
        let octets = addr.octets();
        Ok(PodNetwork(Arc::new(Inner {
            cidr: cidr.to_string(),
            base: [octets[0], octets[1]],
            leases: Mutex::new(vec![HashMap::new(); nodes]),
        })))
    }

    /// The node's own address.
    pub fn node_ip(&self, node: usize) -> Ipv4Addr {
        Ipv4Addr::new(self.0.base[0], self.0.base[1], node as u8, 1)
    }

    /// The IP of pod `uid` on node `node`, the same for as long as it lives.
    pub fn lease(&self, node: usize, uid: &str) -> Result<Ipv4Addr> {
        let mut leases = self.0.leases.lock().expect("the lease table is never poisoned");
        let table = &mut leases[node];
        if let Some(ip) = table.get(uid) {
            return Ok(*ip);
        }
        let taken: Vec<Ipv4Addr> = table.values().copied().collect();
        let ip = (2..=254u8)
            .map(|host| Ipv4Addr::new(self.0.base[0], self.0.base[1], node as u8, host))
            .find(|ip| !taken.contains(ip))
            .context("no pod IP left on this node")?;
        table.insert(uid.to_string(), ip);
        Ok(ip)
    }

    pub fn release(&self, node: usize, uid: &str) {
        self.0.leases.lock().expect("the lease table is never poisoned")[node].remove(uid);
    }

    /// Removes the route (at shutdown).
    pub fn release_all(&self) {
        let _ = ip(&["route", "del", "local", &self.0.cidr, "dev", "lo"]);
    }
}

fn ip(args: &[&str]) -> Result<()> {
    let status = Command::new("ip").args(args).status().context("running ip")?;
    if !status.success() {
        bail!("ip {} failed: {status}", args.join(" "));
    }
    Ok(())
}
