//! What one container runs as: program, arguments, environment, folders.
//!
//! A container sees absolute paths (`/models`, `/etc/nereid/config`) that
//! are its volumes' mount paths. Processes here share the host's file
//! system, so every mount path is rewritten to the volume's folder under the
//! pod's root wherever it appears in the command, the arguments and the
//! environment (longest mount path first, at path boundaries). The image
//! decides the program: a Nereid image runs its command from `--bin-dir`;
//! any other image is refused, as an image that cannot be pulled.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::{Client, ResourceExt};

use crate::pods::RunnerConfig;
use crate::volumes;

/// Where a service-account token is mounted; kube clients find it through
/// the KUBECONFIG the plan writes next to it.
pub const SERVICE_ACCOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Where the image keeps its programs (and its PATH).
const IMAGE_BIN_DIR: &str = "/usr/local/bin/";
/// Where a container's termination message is written unless it says otherwise.
const TERMINATION_LOG: &str = "/dev/termination-log";

/// Why a container cannot start, in the kubelet's terms.
#[derive(Debug)]
pub enum Refusal {
    /// The image is not one this node can run (`ErrImagePull`).
    Image(String),
    /// Its environment or volumes cannot be built (`CreateContainerConfigError`).
    Config(String),
}

/// One container, ready to spawn.
#[derive(Debug, Clone)]
pub struct ContainerPlan {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub log: PathBuf,
    pub termination_log: PathBuf,
    /// The pod's network namespace, which the process runs in.
    pub netns: String,
    /// Mount paths to their folders, longest first: for the exec probes'
    /// and hooks' commands, rewritten like the container's own.
    pub mounts: Vec<(String, PathBuf)>,
}

/// The pod's addresses, for its environment and the downward API (the pod
/// object's own status is not written yet when its first containers start).
#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    pub pod: Ipv4Addr,
    pub host: Ipv4Addr,
}

/// What every container of one pod shares.
pub struct PodContext<'a> {
    pub client: &'a Client,
    pub config: &'a RunnerConfig,
    pub pod: &'a Pod,
    pub addresses: Addresses,
    /// The pod's network namespace (see `network.rs`).
    pub netns: &'a str,
    pub root: &'a Path,
    pub volumes: &'a BTreeMap<String, PathBuf>,
}

pub async fn plan(ctx: &PodContext<'_>, container: &Container) -> Result<ContainerPlan, Refusal> {
    let image = container.image.clone().unwrap_or_default();
    if !image.contains(&ctx.config.image_pattern) {
        return Err(Refusal::Image(format!(
            "image \"{image}\" cannot be run by the process node: only images matching '{}' are (they run the binaries of {})",
            ctx.config.image_pattern,
            ctx.config.bin_dir.display()
        )));
    }
    let own = ctx.root.join("containers").join(&container.name);
    tokio::fs::create_dir_all(&own)
        .await
        .map_err(|e| Refusal::Config(format!("creating {}: {e}", own.display())))?;

    // Mount paths, longest first, to the folders they are on this host.
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = ctx
            .volumes
            .get(&mount.name)
            .ok_or_else(|| Refusal::Config(format!("volume \"{}\" not found", mount.name)))?;
        let dir = match &mount.sub_path {
            Some(sub) if !sub.is_empty() => volume.join(sub),
            _ => volume.clone(),
        };
        mounts.push((mount.mount_path.trim_end_matches('/').to_string(), dir));
    }
    if !mounts.iter().any(|(p, _)| p == "/tmp") {
        let tmp = own.join("tmp");
        tokio::fs::create_dir_all(&tmp)
            .await
            .map_err(|e| Refusal::Config(e.to_string()))?;
        mounts.push(("/tmp".into(), tmp));
    }
    let termination = container
        .termination_message_path
        .clone()
        .unwrap_or_else(|| TERMINATION_LOG.to_string());
    mounts.push((termination.clone(), own.join("termination-log")));
    mounts.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));

    let mut env = base_env(ctx, &mounts);
    let base: Vec<String> = env.iter().map(|(k, _)| k.clone()).collect();
    resolve_env(ctx, container, &mut env)
        .await
        .map_err(|e| Refusal::Config(format!("{e:#}")))?;
    // Only what the pod spec says is in the container's view of paths.
    let given: Vec<String> = container.env.iter().flatten().map(|v| v.name.clone()).collect();
    for (name, value) in env.iter_mut() {
        if !base.contains(name) || given.contains(name) {
            *value = rewrite(value, &mounts);
        }
    }
    if let Some((_, dir)) = mounts.iter().find(|(p, _)| p == SERVICE_ACCOUNT_PATH) {
        let kubeconfig = write_kubeconfig(ctx, dir, &own)
            .await
            .map_err(|e| Refusal::Config(format!("{e:#}")))?;
        env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
    }

    // The image's entrypoint and command: nereid-server on /models.
    let mut words: Vec<String> = match &container.command {
        Some(command) if !command.is_empty() => command.clone(),
        _ => vec!["nereid-server".into()],
    };
    match &container.args {
        Some(args) => words.extend(args.iter().cloned()),
        None if container.command.is_none() => words.extend(["--model-repository".into(), "/models".into()]),
        None => {}
    }
    let lookup: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let words: Vec<String> = words.iter().map(|w| rewrite(&expand(w, &lookup), &mounts)).collect();
    let program = find_program(&words[0], &ctx.config.bin_dir).map_err(|e| Refusal::Image(format!("{e:#}")))?;
    let cwd = match &container.working_dir {
        Some(dir) => PathBuf::from(rewrite(dir, &mounts)),
        None => own.clone(),
    };
    Ok(ContainerPlan {
        program,
        args: words[1..].to_vec(),
        env,
        cwd,
        log: own.join("log"),
        termination_log: own.join("termination-log"),
        netns: ctx.netns.to_string(),
        mounts,
    })
}

/// What every container's environment starts with: the image's and the
/// runtime's variables.
fn base_env(ctx: &PodContext<'_>, mounts: &[(String, PathBuf)]) -> Vec<(String, String)> {
    let tmp = mounts
        .iter()
        .find(|(p, _)| p == "/tmp")
        .map(|(_, d)| d.display().to_string())
        .unwrap_or_default();
    let (api_host, api_port) = ctx
        .config
        .api_server
        .rsplit_once(':')
        .unwrap_or((&ctx.config.api_server, "443"));
    let mut env = vec![
        (
            "PATH".into(),
            format!(
                "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ctx.config.bin_dir.display()
            ),
        ),
        ("HOSTNAME".into(), ctx.pod.name_any()),
        ("HOME".into(), ctx.root.display().to_string()),
        ("TMPDIR".into(), tmp),
        ("KUBERNETES_SERVICE_HOST".into(), api_host.to_string()),
        ("KUBERNETES_SERVICE_PORT".into(), api_port.to_string()),
    ];
    // The image's own environment (the Dockerfile's ENV).
    if let Ok(ort) = std::env::var("ORT_DYLIB_PATH") {
        env.push(("ORT_DYLIB_PATH".into(), ort));
    }
    env
}

/// envFrom, then env (later names win), `$(VAR)` expanded as the kubelet does.
async fn resolve_env(ctx: &PodContext<'_>, container: &Container, env: &mut Vec<(String, String)>) -> Result<()> {
    let namespace = ctx.pod.namespace().unwrap_or_default();
    let set = |env: &mut Vec<(String, String)>, name: String, value: String| {
        env.retain(|(k, _)| *k != name);
        env.push((name, value));
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let data = if let Some(secret) = &from.secret_ref {
            volumes::secret_data(ctx.client, &namespace, &secret.name, secret.optional.unwrap_or(false)).await?
        } else if let Some(cm) = &from.config_map_ref {
            volumes::config_map(ctx.client, &namespace, &cm.name, cm.optional.unwrap_or(false)).await?
        } else {
            BTreeMap::new()
        };
        for (key, value) in data {
            set(
                env,
                format!("{prefix}{key}"),
                String::from_utf8_lossy(&value).into_owned(),
            );
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) => {
                let lookup: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                expand(value, &lookup)
            }
            (None, Some(from)) => {
                if let Some(selector) = &from.field_ref {
                    field(ctx.pod, &selector.field_path, ctx.addresses)?
                } else if let Some(key) = &from.secret_key_ref {
                    let optional = key.optional.unwrap_or(false);
                    let data = volumes::secret_data(ctx.client, &namespace, &key.name, optional).await?;
                    match data.get(&key.key) {
                        Some(v) => String::from_utf8_lossy(v).into_owned(),
                        None if optional => continue,
                        None => bail!("couldn't find key {} in Secret {namespace}/{}", key.key, key.name),
                    }
                } else if let Some(key) = &from.config_map_key_ref {
                    let optional = key.optional.unwrap_or(false);
                    let data = volumes::config_map(ctx.client, &namespace, &key.name, optional).await?;
                    match data.get(&key.key) {
                        Some(v) => String::from_utf8_lossy(v).into_owned(),
                        None if optional => continue,
                        None => bail!("couldn't find key {} in ConfigMap {namespace}/{}", key.key, key.name),
                    }
                } else {
                    bail!(
                        "env '{}': only fieldRef, secretKeyRef and configMapKeyRef are supported",
                        var.name
                    )
                }
            }
            (None, None) => String::new(),
        };
        set(env, var.name.clone(), value);
    }
    Ok(())
}

/// A downward-API field of the pod.
pub fn field(pod: &Pod, path: &str, addresses: Addresses) -> Result<String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let value = match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.uid" => pod.uid().unwrap_or_default(),
        "spec.nodeName" => spec.node_name.unwrap_or_default(),
        "spec.serviceAccountName" => spec.service_account_name.unwrap_or_default(),
        "status.podIP" | "status.podIPs" => addresses.pod.to_string(),
        "status.hostIP" | "status.hostIPs" => addresses.host.to_string(),
        other => {
            let label = |prefix: &str, map: &BTreeMap<String, String>| {
                other
                    .strip_prefix(prefix)
                    .and_then(|rest| rest.strip_prefix("['").and_then(|r| r.strip_suffix("']")))
                    .map(|key| map.get(key).cloned().unwrap_or_default())
            };
            label("metadata.labels", pod.labels())
                .or_else(|| label("metadata.annotations", pod.annotations()))
                .with_context(|| format!("field path '{other}' is not supported"))?
        }
    };
    Ok(value)
}

/// `$(VAR)` to its value, `$$` to `$`; unknown references stay as written.
pub fn expand(text: &str, env: &BTreeMap<&str, &str>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
            && let Some(value) = env.get(&inner[..end])
        {
            out.push_str(value);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Every mount path in `text` to its folder on this host, at path
/// boundaries, in one pass: a folder written in never matches again (the
/// per-pod root may itself sit under a mount path such as `/tmp`).
/// `mounts` is longest path first, so the innermost mount wins.
pub fn rewrite(text: &str, mounts: &[(String, PathBuf)]) -> String {
    let path_char = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let at_boundary = out.chars().last().is_none_or(|b| !(path_char(b) || b == '/'));
        let found = mounts.iter().find(|(path, _)| {
            at_boundary
                && rest.starts_with(path.as_str())
                && rest[path.len()..].chars().next().is_none_or(|a| !path_char(a))
        });
        match found {
            Some((path, dir)) => {
                out.push_str(&dir.display().to_string());
                rest = &rest[path.len()..];
            }
            None => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

fn find_program(name: &str, bin_dir: &Path) -> Result<PathBuf> {
    // The image is `FROM scratch`: its programs are the Nereid binaries in
    // /usr/local/bin (here `--bin-dir`) and nothing else, no shell. Looking
    // on the host too would let a pod spec that needs `/bin/sh` pass here
    // and fail in every real cluster.
    let file = match name.strip_prefix(IMAGE_BIN_DIR) {
        Some(file) => file,
        None if name.contains('/') => bail!("{name}: no such file in the image (its programs are in {IMAGE_BIN_DIR})"),
        None => name,
    };
    let path = bin_dir.join(file);
    if !file.is_empty() && !file.contains('/') && path.is_file() {
        return Ok(path);
    }
    bail!(
        "executable \"{name}\" not found in the image (its programs, from {}: nereid-server, nereid-fetch, ...; no shell)",
        bin_dir.display()
    )
}

/// A kubeconfig for in-cluster clients: the pod's token and the cluster CA.
async fn write_kubeconfig(ctx: &PodContext<'_>, token_dir: &Path, own: &Path) -> Result<PathBuf> {
    let ca = token_dir.join("ca.crt");
    let ca = if ca.is_file() { ca } else { ctx.config.api_ca.clone() };
    let namespace = ctx.pod.namespace().unwrap_or_default();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: cluster\n  cluster:\n    server: https://{}\n    certificate-authority: {}\nusers:\n- name: pod\n  user:\n    tokenFile: {}\ncontexts:\n- name: pod\n  context: {{cluster: cluster, user: pod, namespace: {namespace}}}\ncurrent-context: pod\n",
        ctx.config.api_server,
        ca.display(),
        token_dir.join("token").display(),
    );
    let path = own.join("kubeconfig");
    tokio::fs::write(&path, text).await?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_rewritten_at_path_boundaries_only() {
        let mounts = vec![
            ("/etc/nereid/config".to_string(), PathBuf::from("/r/v/config")),
            ("/models".to_string(), PathBuf::from("/r/v/models")),
        ];
        assert_eq!(
            rewrite("--model-repository /models", &mounts),
            "--model-repository /r/v/models"
        );
        assert_eq!(
            rewrite("dest=\"/models/${NAME}\"", &mounts),
            "dest=\"/r/v/models/${NAME}\""
        );
        assert_eq!(
            rewrite("m=/etc/nereid/config/config.json", &mounts),
            "m=/r/v/config/config.json"
        );
        assert_eq!(rewrite("/modelsx /x/models", &mounts), "/modelsx /x/models");
    }

    #[test]
    fn a_rewritten_path_is_not_rewritten_again() {
        let mounts = vec![
            ("/etc/nereid/config".to_string(), PathBuf::from("/tmp/e2e/pod/config")),
            ("/tmp".to_string(), PathBuf::from("/tmp/e2e/pod/tmp")),
        ];
        assert_eq!(
            rewrite("m=/etc/nereid/config/c.json /tmp/x", &mounts),
            "m=/tmp/e2e/pod/config/c.json /tmp/e2e/pod/tmp/x"
        );
    }

    #[test]
    fn variables_expand_like_the_kubelets() {
        let env = BTreeMap::from([("KEY", "s3cret"), ("IP", "10.244.0.2")]);
        assert_eq!(expand("a:$(KEY)@$(IP)", &env), "a:s3cret@10.244.0.2");
        assert_eq!(expand("$(MISSING) $$(KEY) $", &env), "$(MISSING) $(KEY) $");
    }
}
