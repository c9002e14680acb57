//! Triton's restricted API groups: `--http-restricted-api` and
//! `--grpc-restricted-protocol`.
//!
//! Each flag is `<group>,<group>,...:<key>=<value>`: requests to an API of a
//! listed group must carry the header (gRPC: metadata) `<key>` with exactly
//! `<value>`, or they are refused with HTTP 403 / gRPC PERMISSION_DENIED
//! before anything else happens. A group may appear in one flag only. This is
//! how a serving pod keeps its model-control API (load, unload) away from
//! anyone who can merely reach the inference port.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The API groups, with Triton's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApiGroup {
    Health,
    Metadata,
    Inference,
    SharedMemory,
    ModelConfig,
    ModelRepository,
    Statistics,
    Trace,
    Logging,
}

impl ApiGroup {
    pub const ALL: [ApiGroup; 9] = [
        ApiGroup::Health,
        ApiGroup::Metadata,
        ApiGroup::Inference,
        ApiGroup::SharedMemory,
        ApiGroup::ModelConfig,
        ApiGroup::ModelRepository,
        ApiGroup::Statistics,
        ApiGroup::Trace,
        ApiGroup::Logging,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApiGroup::Health => "health",
            ApiGroup::Metadata => "metadata",
            ApiGroup::Inference => "inference",
            ApiGroup::SharedMemory => "shared-memory",
            ApiGroup::ModelConfig => "model-config",
            ApiGroup::ModelRepository => "model-repository",
            ApiGroup::Statistics => "statistics",
            ApiGroup::Trace => "trace",
            ApiGroup::Logging => "logging",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ApiGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ApiGroup {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        ApiGroup::ALL.into_iter().find(|g| g.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = ApiGroup::ALL.iter().map(|g| g.as_str()).collect();
            format!("unknown restricted protocol '{s}'; known ones are {}", names.join(", "))
        })
    }
}

/// The header a restricted group requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restriction {
    /// Lower-case, as HTTP/2 and gRPC metadata carry header names.
    pub key: String,
    pub value: String,
}

/// One flag: the groups and the header they require.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestrictionFlag {
    pub groups: Vec<ApiGroup>,
    pub restriction: Restriction,
}

impl FromStr for RestrictionFlag {
    type Err = String;

    fn from_str(flag: &str) -> Result<Self, String> {
        let (groups, header) = flag
            .split_once(':')
            .ok_or_else(|| format!("expected <group>,...:<key>=<value>, got '{flag}'"))?;
        let (key, value) = header
            .split_once('=')
            .ok_or_else(|| format!("expected <key>=<value> after ':', got '{header}'"))?;
        let key = key.trim().to_ascii_lowercase();
        if key.is_empty() || http::HeaderName::from_bytes(key.as_bytes()).is_err() {
            return Err(format!("'{key}' is not a valid header name"));
        }
        if value.is_empty() {
            return Err(format!("the value for restricted key '{key}' must not be empty"));
        }
        let groups = groups
            .split(',')
            .map(|g| g.trim().parse())
            .collect::<Result<Vec<ApiGroup>, String>>()?;
        Ok(RestrictionFlag {
            groups,
            restriction: Restriction {
                key,
                value: value.to_string(),
            },
        })
    }
}

/// `<group>,...:<key>=<ENV_VAR>`: a [`RestrictionFlag`] whose value is read
/// from the environment variable `ENV_VAR` once, at start, so the secret is
/// in no process's arguments (where `ps` and /proc show it to every user of
/// the machine). The operator's pods pass the repository-API key so, from a
/// Secret.
#[derive(Clone)]
pub struct EnvRestrictionFlag(pub RestrictionFlag);

impl std::fmt::Debug for EnvRestrictionFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvRestrictionFlag")
            .field("groups", &self.0.groups)
            .field("key", &self.0.restriction.key)
            .finish_non_exhaustive()
    }
}

impl FromStr for EnvRestrictionFlag {
    type Err = String;

    fn from_str(flag: &str) -> Result<Self, String> {
        Self::read(flag, |name| std::env::var(name).ok())
    }
}

impl EnvRestrictionFlag {
    fn read(flag: &str, env: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let (head, variable) = flag
            .rsplit_once('=')
            .ok_or_else(|| format!("expected <group>,...:<key>=<ENV_VAR>, got '{flag}'"))?;
        let value = env(variable.trim())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("the environment variable '{}' is unset or empty", variable.trim()))?;
        format!("{head}={value}").parse().map(EnvRestrictionFlag)
        // The parse's errors name groups and keys, never the value.
    }
}

/// Which groups are restricted, and how.
#[derive(Debug, Clone, Default)]
pub struct RestrictedApis {
    by_group: [Option<Restriction>; 9],
}

impl RestrictedApis {
    /// Combines the flags; a group named by two flags is an error, as in Triton.
    pub fn new(flags: &[RestrictionFlag]) -> Result<Self, String> {
        let mut apis = RestrictedApis::default();
        for flag in flags {
            for group in &flag.groups {
                let slot = &mut apis.by_group[group.index()];
                if slot.is_some() {
                    return Err(format!(
                        "protocol '{group}' can not be specified in multiple config groups"
                    ));
                }
                *slot = Some(flag.restriction.clone());
            }
        }
        Ok(apis)
    }

    pub fn restriction(&self, group: ApiGroup) -> Option<&Restriction> {
        self.by_group[group.index()].as_ref()
    }

    /// Lets a request through, or refuses it. `header` looks a header up by
    /// its lower-case name.
    pub fn check<'h>(&self, group: ApiGroup, header: impl Fn(&str) -> Option<&'h [u8]>) -> Result<()> {
        let Some(restriction) = self.restriction(group) else {
            return Ok(());
        };
        match header(&restriction.key) {
            Some(given) if constant_time_eq(given, restriction.value.as_bytes()) => Ok(()),
            _ => Err(Error::permission_denied(format!(
                "This API is restricted, expecting header '{}' with valid value",
                restriction.key
            ))),
        }
    }
}

/// Compares without stopping at the first difference, so the time taken
/// does not tell an attacker how much of a guessed value was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apis(flags: &[&str]) -> Result<RestrictedApis, String> {
        let flags = flags
            .iter()
            .map(|f| f.parse())
            .collect::<Result<Vec<RestrictionFlag>, String>>()?;
        RestrictedApis::new(&flags)
    }

    #[test]
    fn parses_tritons_form() {
        let flag: RestrictionFlag = "model-repository,statistics:Admin-Key=s3cr:et=".parse().unwrap();
        assert_eq!(flag.groups, vec![ApiGroup::ModelRepository, ApiGroup::Statistics]);
        assert_eq!(flag.restriction.key, "admin-key");
        assert_eq!(flag.restriction.value, "s3cr:et=");
        for bad in [
            "model-repository",
            "model-repository:key",
            "nope:k=v",
            "health:k=",
            "health:bad key=v",
        ] {
            assert!(bad.parse::<RestrictionFlag>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_value_may_come_from_the_environment() {
        let env = |name: &str| (name == "KEY").then(|| "s3cret".to_string());
        let flag = EnvRestrictionFlag::read("model-repository:admin-key=KEY", env).unwrap();
        assert_eq!(flag.0.groups, vec![ApiGroup::ModelRepository]);
        assert_eq!(flag.0.restriction.value, "s3cret");
        assert!(!format!("{flag:?}").contains("s3cret"));
        let e = EnvRestrictionFlag::read("model-repository:admin-key=NOPE", env).unwrap_err();
        assert_eq!(e, "the environment variable 'NOPE' is unset or empty");
        assert!(EnvRestrictionFlag::read("model-repository", env).is_err());
    }

    #[test]
    fn a_group_belongs_to_one_flag() {
        let e = apis(&["model-repository,health:k1=v1", "metadata,health:k2=v2"]).unwrap_err();
        assert_eq!(e, "protocol 'health' can not be specified in multiple config groups");
    }

    #[test]
    fn checks_the_header_of_restricted_groups_only() {
        let apis = apis(&["model-repository:admin-key=yes"]).unwrap();
        let none = |_: &str| None;
        assert!(apis.check(ApiGroup::Inference, none).is_ok());
        let e = apis.check(ApiGroup::ModelRepository, none).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::PermissionDenied);
        assert_eq!(
            e.message(),
            "This API is restricted, expecting header 'admin-key' with valid value"
        );
        assert!(
            apis.check(ApiGroup::ModelRepository, |_| Some(b"no".as_slice()))
                .is_err()
        );
        assert!(
            apis.check(ApiGroup::ModelRepository, |_| Some(b"yes!".as_slice()))
                .is_err()
        );
        assert!(
            apis.check(ApiGroup::ModelRepository, |k| (k == "admin-key")
                .then_some(b"yes".as_slice()))
                .is_ok()
        );
    }
}
