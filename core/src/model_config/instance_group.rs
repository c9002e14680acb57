//! Where a model's instances run, resolved against the GPUs this server
//! sees, as Triton normalises `instance_group`:
//!
//! - no group at all: one group of kind KIND_AUTO;
//! - KIND_AUTO: KIND_GPU on every visible GPU when the backend can use one
//!   and a GPU is visible, otherwise KIND_CPU;
//! - KIND_GPU without `gpus`: every visible GPU; with `gpus`, each must be
//!   visible (a CUDA ordinal, `CUDA_VISIBLE_DEVICES` applied);
//! - KIND_CPU and KIND_MODEL name no GPU.
//!
//! `count` is per GPU for KIND_GPU. A KIND_GPU group on a server that sees
//! no GPU fails the load with a reason naming the group, so the model is
//! UNAVAILABLE and every other model serves.

use std::collections::HashSet;

use nereid_gpu::Gpus;
use nereid_proto::inference::{ModelConfig, ModelInstanceGroup, model_instance_group::Kind};

use crate::error::{Error, Result};

/// Resolves every group of `config` in place; `gpu_capable` says whether
/// the model's backend can run an instance on a GPU.
pub fn resolve(config: &mut ModelConfig, gpus: &Gpus, gpu_capable: bool) -> Result<()> {
    if config.instance_group.is_empty() {
        config.instance_group.push(ModelInstanceGroup {
            count: 1,
            kind: Kind::Auto as i32,
            ..Default::default()
        });
    }
    let model = config.name.clone();
    for (i, group) in config.instance_group.iter_mut().enumerate() {
        if group.name.is_empty() {
            group.name = format!("{model}_{i}");
        }
        if group.count == 0 {
            group.count = 1;
        }
        if group.kind == Kind::Auto as i32 {
            if gpu_capable && !gpus.is_empty() {
                group.kind = Kind::Gpu as i32;
            } else {
                group.kind = Kind::Cpu as i32;
                // KIND_AUTO's `gpus` only mean something on a GPU.
                group.gpus.clear();
            }
        }
        match Kind::try_from(group.kind) {
            Ok(Kind::Gpu) => resolve_gpus(&model, group, gpus, gpu_capable)?,
            Ok(Kind::Cpu | Kind::Model) if !group.gpus.is_empty() => {
                return Err(Error::invalid(format!(
                    "instance group '{}' of model '{model}' has kind {} but names GPUs {:?}; only KIND_GPU \
                     and KIND_AUTO groups may",
                    group.name,
                    kind_name(group.kind),
                    group.gpus
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

fn resolve_gpus(model: &str, group: &mut ModelInstanceGroup, gpus: &Gpus, capable: bool) -> Result<()> {
    if gpus.is_empty() {
        return Err(Error::unavailable(format!(
            "instance group '{}' of model '{model}' has kind KIND_GPU, but this server sees no GPU: {}",
            group.name,
            gpus.absent_reason().unwrap_or("none is visible")
        )));
    }
    if !capable {
        return Err(Error::unsupported(format!(
            "instance group '{}' of model '{model}' has kind KIND_GPU, but its backend runs on the CPU only",
            group.name
        )));
    }
    let visible = gpus.ordinals();
    if group.gpus.is_empty() {
        group.gpus = visible;
        return Ok(());
    }
    if let Some(missing) = group.gpus.iter().find(|id| !visible.contains(id)) {
        return Err(Error::invalid(format!(
            "instance group '{}' of model '{model}' names GPU {missing}, which this server does not see; \
             visible are {visible:?} (CUDA ordinals, CUDA_VISIBLE_DEVICES applied)",
            group.name
        )));
    }
    // Every id is visible now, so the set holds at most one per GPU, however
    // long the list a config (or a load request's override) gives.
    let mut seen = HashSet::with_capacity(visible.len());
    if let Some(id) = group.gpus.iter().find(|id| !seen.insert(**id)) {
        return Err(Error::invalid(format!(
            "instance group '{}' of model '{model}' names GPU {id} twice; use 'count' for more instances on it",
            group.name
        )));
    }
    Ok(())
}

fn kind_name(kind: i32) -> &'static str {
    Kind::try_from(kind).map_or("an unknown kind", |k| k.as_str_name())
}

#[cfg(test)]
mod tests {
    use nereid_gpu::Gpu;

    use super::*;
    use crate::error::ErrorKind;

    fn config(groups: Vec<ModelInstanceGroup>) -> ModelConfig {
        ModelConfig {
            name: "m".into(),
            instance_group: groups,
            ..Default::default()
        }
    }

    fn group(kind: Kind, count: i32, gpus: Vec<i32>) -> ModelInstanceGroup {
        ModelInstanceGroup {
            kind: kind as i32,
            count,
            gpus,
            ..Default::default()
        }
    }

    /// The GPUs a server sees, as the selection logic reads them: ordinals
    /// and names. No test here opens a device.
    fn visible(n: i32) -> Gpus {
        Gpus::listed(
            (0..n)
                .map(|ordinal| Gpu {
                    ordinal,
                    uuid: format!("GPU-{ordinal:08x}-0000-0000-0000-000000000000"),
                    name: "listed".into(),
                    total_memory: 0,
                })
                .collect(),
        )
    }

    #[test]
    fn no_group_is_one_auto_group_resolved_by_what_is_visible() {
        let mut cpu_only = config(Vec::new());
        resolve(&mut cpu_only, &Gpus::none("no driver"), true).unwrap();
        assert_eq!(
            cpu_only.instance_group,
            vec![ModelInstanceGroup {
                name: "m_0".into(),
                kind: Kind::Cpu as i32,
                count: 1,
                ..Default::default()
            }]
        );
        let mut two = config(Vec::new());
        resolve(&mut two, &visible(2), true).unwrap();
        assert_eq!(two.instance_group[0].kind, Kind::Gpu as i32);
        assert_eq!(two.instance_group[0].gpus, vec![0, 1]);
        // A backend that cannot use them stays on the CPU.
        let mut cpu_backend = config(Vec::new());
        resolve(&mut cpu_backend, &visible(2), false).unwrap();
        assert_eq!(cpu_backend.instance_group[0].kind, Kind::Cpu as i32);
    }

    #[test]
    fn kind_auto_drops_its_gpus_on_the_cpu() {
        let mut c = config(vec![group(Kind::Auto, 2, vec![1])]);
        resolve(&mut c, &Gpus::none("no driver"), true).unwrap();
        assert_eq!(
            (c.instance_group[0].kind, c.instance_group[0].count),
            (Kind::Cpu as i32, 2)
        );
        assert!(c.instance_group[0].gpus.is_empty());
        let mut c = config(vec![group(Kind::Auto, 2, vec![1])]);
        resolve(&mut c, &visible(2), true).unwrap();
        assert_eq!(
            (c.instance_group[0].kind, &c.instance_group[0].gpus),
            (Kind::Gpu as i32, &vec![1])
        );
    }

    #[test]
    fn kind_gpu_without_a_gpu_is_unavailable_naming_the_group_and_the_reason() {
        let mut c = config(vec![group(Kind::Gpu, 1, Vec::new())]);
        let e = resolve(&mut c, &Gpus::none("libcuda.so was not found"), true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(
            e.message(),
            "instance group 'm_0' of model 'm' has kind KIND_GPU, but this server sees no GPU: libcuda.so was not found"
        );
    }

    #[test]
    fn kind_gpu_takes_every_visible_gpu_or_the_named_ones() {
        let mut c = config(vec![group(Kind::Gpu, 2, Vec::new()), group(Kind::Gpu, 1, vec![2, 0])]);
        resolve(&mut c, &visible(3), true).unwrap();
        assert_eq!(c.instance_group[0].gpus, vec![0, 1, 2]);
        assert_eq!(c.instance_group[1].gpus, vec![2, 0]);
    }

    #[test]
    fn a_gpu_that_is_not_visible_or_named_twice_is_refused() {
        let mut c = config(vec![group(Kind::Gpu, 1, vec![0, 3])]);
        let e = resolve(&mut c, &visible(2), true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(
            e.message().contains("names GPU 3") && e.message().contains("visible are [0, 1]"),
            "{e}"
        );
        let mut c = config(vec![group(Kind::Gpu, 1, vec![1, 1])]);
        let e = resolve(&mut c, &visible(2), true).unwrap_err();
        assert!(e.message().contains("GPU 1 twice"), "{e}");
    }

    #[test]
    fn cpu_groups_name_no_gpu_and_cpu_backends_take_no_gpu_group() {
        let mut c = config(vec![group(Kind::Cpu, 1, vec![0])]);
        let e = resolve(&mut c, &visible(1), true).unwrap_err();
        assert!(e.message().contains("has kind KIND_CPU but names GPUs [0]"), "{e}");
        let mut c = config(vec![group(Kind::Gpu, 1, Vec::new())]);
        let e = resolve(&mut c, &visible(1), false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
    }
}
