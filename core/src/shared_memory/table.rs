//! The named regions of one kind (system or CUDA), with Triton's rules for
//! names: a register of a name already taken fails, an unregister of an
//! unknown one succeeds, a status of one names what is missing. At most
//! [`MAX_REGIONS`] at once: each holds a mapping.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;

use super::MAX_REGIONS;
use crate::error::{Error, ErrorKind, Result};

/// One registered region: what status reports, and its mapping.
pub(super) struct Region<S, M> {
    pub status: S,
    pub memory: M,
}

/// One kind's regions, each shared with the copies in flight.
pub(super) struct RegionTable<S, M> {
    /// How the messages name the kind: "" for system regions (Triton's
    /// words), "CUDA " for CUDA ones.
    kind: &'static str,
    regions: RwLock<BTreeMap<String, Arc<Region<S, M>>>>,
}

impl<S: Clone, M> RegionTable<S, M> {
    pub(super) fn new(kind: &'static str) -> Self {
        RegionTable {
            kind,
            regions: RwLock::default(),
        }
    }

    /// Refuses a name that cannot be registered now (checked again at
    /// [`Self::insert`], which may race with another register).
    pub(super) fn check_new(&self, name: &str) -> Result<()> {
        if name.is_empty() {
            return Err(Error::invalid("a shared memory region needs a name"));
        }
        self.check_room(&self.regions.read(), name)
    }

    /// Adds `name` with its mapping, opened after [`Self::check_new`].
    pub(super) fn insert(&self, name: &str, status: S, memory: M) -> Result<()> {
        let mut regions = self.regions.write();
        self.check_room(&regions, name)?;
        regions.insert(name.to_string(), Arc::new(Region { status, memory }));
        Ok(())
    }

    fn check_room(&self, regions: &BTreeMap<String, Arc<Region<S, M>>>, name: &str) -> Result<()> {
        if regions.contains_key(name) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("shared memory region '{name}' already in manager"),
            ));
        }
        if regions.len() >= MAX_REGIONS {
            return Err(Error::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "the server holds its maximum of {MAX_REGIONS} {}shared memory regions; unregister one first",
                    self.kind
                ),
            ));
        }
        Ok(())
    }

    /// Unregisters `name` (every region when `None`); an unknown name is
    /// not an error. Copies in flight keep their mapping until they end.
    pub(super) fn unregister(&self, name: Option<&str>) {
        let mut regions = self.regions.write();
        match name {
            Some(name) => {
                regions.remove(name);
            }
            None => regions.clear(),
        }
    }

    /// The statuses (`name`'s alone when given; an unknown one is `missing(name)`).
    pub(super) fn status(&self, name: Option<&str>, missing: impl Fn(&str) -> Error) -> Result<Vec<S>> {
        let regions = self.regions.read();
        match name {
            Some(name) => regions
                .get(name)
                .map(|region| vec![region.status.clone()])
                .ok_or_else(|| missing(name)),
            None => Ok(regions.values().map(|region| region.status.clone()).collect()),
        }
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.regions.read().contains_key(name)
    }

    /// The region, shared with the copy about to use it.
    pub(super) fn get(&self, name: &str) -> Option<Arc<Region<S, M>>> {
        self.regions.read().get(name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_bounded_and_unregistered_quietly() {
        let table: RegionTable<u32, ()> = RegionTable::new("CUDA ");
        assert!(table.check_new("").unwrap_err().message().contains("needs a name"));
        table.insert("a", 1, ()).unwrap();
        let taken = table.insert("a", 2, ()).unwrap_err();
        assert_eq!(taken.kind(), ErrorKind::AlreadyExists);
        assert_eq!(taken.message(), "shared memory region 'a' already in manager");
        for i in 1..MAX_REGIONS {
            table.insert(&format!("r{i}"), 0, ()).unwrap();
        }
        let full = table.check_new("one more").unwrap_err();
        assert_eq!(full.kind(), ErrorKind::ResourceExhausted);
        assert_eq!(
            full.message(),
            "the server holds its maximum of 1024 CUDA shared memory regions; unregister one first"
        );
        table.unregister(Some("never registered"));
        table.unregister(Some("a"));
        assert!(!table.contains("a") && table.check_new("a").is_ok());
        let missing = table
            .status(Some("a"), |name| Error::not_found(name.to_string()))
            .unwrap_err();
        assert_eq!(missing.message(), "a");
        table.unregister(None);
        assert!(table.status(None, |_| unreachable!()).unwrap().is_empty());
    }
}
