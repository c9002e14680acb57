//! Pod networking as a bridge CNI plugin gives it: each node has a bridge
//! (`nereid<i>`, address `10.244.i.1/24`, which is the node's own address),
//! and each pod a network namespace named after its UID, joined to its
//! node's bridge by a veth pair, its IP (`10.244.i.2` and up) on `eth0`
//! inside, and a default route via the bridge. Its containers run in that
//! namespace (`ip netns exec`), so they bind 0.0.0.0 like in a real pod and
//! two pods can both listen on 8001. The namespace's /etc files
//! (`/etc/netns/<uid>/hosts` and `resolv.conf`, which `ip netns exec` mounts
//! over /etc's) are the pod's own, as the kubelet writes them.
//!
//! The bridges route between the nodes' ranges (IP forwarding on), bridged
//! traffic passes iptables (`bridge-nf-call-iptables`), so that kube-proxy's
//! rules apply to pod traffic too, and the default route goes to the first
//! bridge, so that ClusterIPs are routable from the namespace itself.
//!
//! All of this lives in the network namespace e2e/netns.sh made, never in
//! the machine's own: [`PodNetwork::claim`] refuses to start elsewhere. When
//! that namespace goes, whatever this module made goes with it.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use tokio::process::Command;

/// Where `ip netns exec` finds a namespace's own /etc files.
const ETC_NETNS: &str = "/etc/netns";
/// The source e2e/netns.sh names its private /etc/netns mount with.
const NETNS_MARK: &str = "nereid-e2e-netns";
/// Each node's /24 has this prefix length; pods are .2 to .254.
const NODE_PREFIX: u8 = 24;

#[derive(Clone)]
pub struct PodNetwork(Arc<Inner>);

struct Inner {
    base: [u8; 2],
    nodes: usize,
    /// The cluster's DNS Service and domain, for the pods' resolv.conf.
    dns: Ipv4Addr,
    domain: String,
    /// Per node.
    leases: Mutex<Vec<Leases>>,
}

/// One node's pod IPs, handed out as the host-local IPAM plugin does: the
/// next free one after the last given, so that a new pod does not take the
/// IP a deleted one had a moment ago (which proxies may still hold).
#[derive(Clone, Default)]
struct Leases {
    /// Pod UID to its IP.
    pods: HashMap<String, Ipv4Addr>,
    /// The host part of the last IP given.
    last: Option<u8>,
}

/// A pod's network: its IP and the namespace its containers run in.
#[derive(Debug, Clone)]
pub struct PodNet {
    pub ip: Ipv4Addr,
    /// The network namespace's name (the pod's UID), for `ip netns exec`.
    pub netns: String,
}

/// What the pod's /etc/hosts names it by.
pub struct PodNames<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
}

impl PodNetwork {
    /// Makes one bridge per node for the /16 `cidr`, after checking that
    /// this is e2e/netns.sh's namespace and not the machine's.
    pub async fn claim(cidr: &str, nodes: usize, dns: Ipv4Addr, domain: &str) -> Result<Self> {
        let (addr, prefix) = cidr.split_once('/').context("--cidr needs a prefix length")?;
        if prefix != "16" {
            bail!("--cidr must be a /16, got {cidr}");
        }
        let addr: Ipv4Addr = addr.parse().context("--cidr address")?;
        if nodes > 250 {
            bail!("at most 250 nodes");
        }
        inside_e2e_namespace()?;
        // Routing between the bridges, and kube-proxy's rules for bridged traffic. Both
        // settings are per network namespace: this one's.
        write_sysctl("net/ipv4/ip_forward", "1")?;
        write_sysctl("net/bridge/bridge-nf-call-iptables", "1")?;
        let octets = addr.octets();
        let network = PodNetwork(Arc::new(Inner {
            base: [octets[0], octets[1]],
            nodes,
            dns,
            domain: domain.to_string(),
            leases: Mutex::new(vec![Leases::default(); nodes]),
        }));
        for node in 0..nodes {
            let bridge = bridge(node);
            // A bridge of an earlier run in this same namespace is replaced.
            let _ = ip(&["link", "del", &bridge]).await;
            ip(&["link", "add", &bridge, "type", "bridge"]).await?;
            let address = format!("{}/{NODE_PREFIX}", network.node_ip(node));
            ip(&["addr", "add", &address, "dev", &bridge]).await?;
            ip(&["link", "set", &bridge, "up"]).await?;
        }
        // A ClusterIP is on no interface: without a route, this namespace's own connections
        // to one (the harness's, CoreDNS's) fail before kube-proxy's OUTPUT rules see them.
        // The namespace has nothing else to route to.
        if nodes > 0 {
            ip(&["route", "replace", "default", "dev", &bridge(0)]).await?;
        }
        Ok(network)
    }

    /// The node's own address (its bridge's).
    pub fn node_ip(&self, node: usize) -> Ipv4Addr {
        Ipv4Addr::new(self.0.base[0], self.0.base[1], node as u8, 1)
    }

    /// Gives pod `uid` on node `node` an IP and a network namespace joined
    /// to the node's bridge, with its /etc files. Undone by [`Self::detach`],
    /// also when it fails halfway.
    pub async fn attach(&self, node: usize, uid: &str, names: PodNames<'_>) -> Result<PodNet> {
        let ip = self.lease(node, uid)?;
        let net = PodNet {
            ip,
            netns: uid.to_string(),
        };
        if let Err(e) = self.plumb(node, &net, &names).await {
            self.detach(node, uid).await;
            return Err(e.context(format!("the network of pod {}/{}", names.namespace, names.name)));
        }
        Ok(net)
    }

    async fn plumb(&self, node: usize, net: &PodNet, names: &PodNames<'_>) -> Result<()> {
        let ns = net.netns.as_str();
        let host_side = veth(net.ip);
        ip(&["netns", "add", ns]).await?;
        ip(&[
            "link", "add", &host_side, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ])
        .await?;
        ip(&["link", "set", &host_side, "master", &bridge(node), "up"]).await?;
        let address = format!("{}/{NODE_PREFIX}", net.ip);
        ip(&["-n", ns, "link", "set", "lo", "up"]).await?;
        ip(&["-n", ns, "addr", "add", &address, "dev", "eth0"]).await?;
        ip(&["-n", ns, "link", "set", "eth0", "up"]).await?;
        let gateway = self.node_ip(node).to_string();
        ip(&["-n", ns, "route", "add", "default", "via", &gateway]).await?;
        let etc = etc_dir(ns);
        tokio::fs::create_dir_all(&etc).await?;
        tokio::fs::write(etc.join("hosts"), hosts(net.ip, names)).await?;
        tokio::fs::write(etc.join("resolv.conf"), self.resolv_conf(names.namespace)).await?;
        Ok(())
    }

    /// Removes pod `uid`'s namespace (its veth pair goes with it) and /etc
    /// files, and frees its IP. Idempotent.
    pub async fn detach(&self, node: usize, uid: &str) {
        let leased = self.0.leases.lock().expect("the lease table is never poisoned")[node]
            .pods
            .remove(uid);
        if let Some(address) = leased {
            // Gone with the namespace, unless the peer never got there.
            let _ = ip(&["link", "del", &veth(address)]).await;
        }
        // Failures here are "already gone".
        let _ = ip(&["netns", "del", uid]).await;
        let _ = tokio::fs::remove_dir_all(etc_dir(uid)).await;
    }

    /// Removes every pod namespace and the bridges (at shutdown).
    pub async fn release_all(&self) {
        let pods: Vec<(usize, String)> = {
            let leases = self.0.leases.lock().expect("the lease table is never poisoned");
            leases
                .iter()
                .enumerate()
                .flat_map(|(node, table)| table.pods.keys().map(move |uid| (node, uid.clone())))
                .collect()
        };
        for (node, uid) in pods {
            self.detach(node, &uid).await;
        }
        for node in 0..self.0.nodes {
            let _ = ip(&["link", "del", &bridge(node)]).await;
        }
    }

    /// The IP of pod `uid` on node `node`, the same for as long as it lives.
    fn lease(&self, node: usize, uid: &str) -> Result<Ipv4Addr> {
        let mut leases = self.0.leases.lock().expect("the lease table is never poisoned");
        let table = &mut leases[node];
        if let Some(ip) = table.pods.get(uid) {
            return Ok(*ip);
        }
        let host = next_free(table.last, |host| {
            let ip = Ipv4Addr::new(self.0.base[0], self.0.base[1], node as u8, host);
            table.pods.values().any(|taken| *taken == ip)
        })
        .context("no pod IP left on this node")?;
        let ip = Ipv4Addr::new(self.0.base[0], self.0.base[1], node as u8, host);
        table.last = Some(host);
        table.pods.insert(uid.to_string(), ip);
        Ok(ip)
    }

    /// The kubelet's resolv.conf for a pod with the ClusterFirst DNS policy.
    fn resolv_conf(&self, namespace: &str) -> String {
        let domain = &self.0.domain;
        format!(
            "search {namespace}.svc.{domain} svc.{domain} {domain}\nnameserver {}\noptions ndots:5\n",
            self.0.dns
        )
    }
}

/// The first host part from 2 to 254 after `last` (from 2 if none),
/// wrapping, that is not `taken`.
fn next_free(last: Option<u8>, taken: impl Fn(u8) -> bool) -> Option<u8> {
    const FIRST: u16 = 2;
    const COUNT: u16 = 253;
    // The index (host - FIRST) after last's.
    let start = last.map_or(0, |last| u16::from(last).saturating_sub(FIRST) + 1);
    (0..COUNT)
        .map(|i| ((start + i) % COUNT + FIRST) as u8)
        .find(|host| !taken(*host))
}

/// The kubelet's hosts file: localhost, and the pod's name on its IP.
fn hosts(ip: Ipv4Addr, names: &PodNames<'_>) -> String {
    format!(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
         {ip}\t{}\n",
        names.name
    )
}

fn bridge(node: usize) -> String {
    format!("nereid{node}")
}

/// The host side of a pod's veth pair, named by its IP (unique while leased,
/// and within the 15 bytes an interface name may have).
fn veth(ip: Ipv4Addr) -> String {
    let [_, _, node, host] = ip.octets();
    format!("veth{node}-{host}")
}

fn etc_dir(netns: &str) -> PathBuf {
    Path::new(ETC_NETNS).join(netns)
}

/// Fails unless /etc/netns is e2e/netns.sh's private mount: the sign that
/// this process runs in the namespaces it made, where bridges, routes,
/// sysctls and pod namespaces touch nothing of the machine's.
fn inside_e2e_namespace() -> Result<()> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    if !marked(&mounts) {
        bail!(
            "not inside e2e/netns.sh's namespaces (no private {ETC_NETNS}): \
             the process node changes the network it runs in, and never the machine's own"
        );
    }
    Ok(())
}

/// Whether mountinfo text has e2e/netns.sh's tmpfs on /etc/netns.
fn marked(mountinfo: &str) -> bool {
    mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER-OPTIONS"
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            return false;
        };
        fields.get(4) == Some(&ETC_NETNS)
            && fields.get(dash + 1) == Some(&"tmpfs")
            && fields.get(dash + 2) == Some(&NETNS_MARK)
    })
}

fn write_sysctl(name: &str, value: &str) -> Result<()> {
    let path = Path::new("/proc/sys").join(name);
    std::fs::write(&path, value).with_context(|| format!("setting {} to {value}", path.display()))
}

/// Runs `ip ARGS`; its stderr in the error.
async fn ip(args: &[&str]) -> Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .await
        .context("running ip (iproute2)")?;
    if !output.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_private_etc_netns_mount_is_the_mark() {
        let inside = "66 46 0:40 / /run/netns rw,relatime - tmpfs nereid-e2e-netns rw,mode=755\n\
                      67 46 0:41 / /etc/netns rw,relatime shared:5 - tmpfs nereid-e2e-netns rw,mode=755\n";
        assert!(marked(inside));
        let host = "25 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n";
        assert!(!marked(host));
        let other_tmpfs = "67 46 0:41 / /etc/netns rw,relatime - tmpfs tmpfs rw\n";
        assert!(!marked(other_tmpfs));
    }

    #[test]
    fn ips_are_handed_out_after_the_last_one_and_wrap() {
        assert_eq!(next_free(None, |_| false), Some(2));
        assert_eq!(next_free(Some(2), |_| false), Some(3));
        // .2 and .3 were freed, but .4 comes first: the next after the last given.
        assert_eq!(next_free(Some(3), |_| false), Some(4));
        assert_eq!(next_free(Some(254), |h| h == 2), Some(3));
        assert_eq!(next_free(Some(9), |_| true), None);
    }

    #[test]
    fn a_veth_name_fits_an_interface_name() {
        assert_eq!(veth(Ipv4Addr::new(10, 244, 250, 254)), "veth250-254");
        assert!(veth(Ipv4Addr::new(10, 244, 250, 254)).len() <= 15);
    }

    #[test]
    fn resolv_conf_searches_the_pods_namespace_first() {
        let network = PodNetwork(Arc::new(Inner {
            base: [10, 244],
            nodes: 1,
            dns: Ipv4Addr::new(10, 96, 0, 10),
            domain: "cluster.local".into(),
            leases: Mutex::new(vec![Leases::default()]),
        }));
        assert_eq!(
            network.resolv_conf("serving"),
            "search serving.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
        );
    }
}
